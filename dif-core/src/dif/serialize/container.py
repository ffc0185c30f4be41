"""A small checksummed container shared by `.difir` and `.difplan`.

Layout (little endian):
    magic (8 bytes) | version u32 | section count u32 | payload length u64 | sha256 (32 bytes)
    payload = repeated [name length u16 | name utf-8 | data length u64 | data]
The checksum covers the payload. Readers check every length against the bytes actually present
before slicing, so truncated or hostile files fail with a `FormatError`, never another error.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from dif.errors import ChecksumError, DifError, FormatError, VersionError

_HEADER = struct.Struct("<8sIIQ32s")
MAX_SECTIONS = 64
MAX_PAYLOAD = 1 << 34  # 16 GiB: a program or plan is metadata, never weights


def pack(magic: bytes, version: int, sections: dict[str, bytes]) -> bytes:
    assert len(magic) == 8
    body = bytearray()
    for name, data in sections.items():
        raw = name.encode()
        body += struct.pack("<H", len(raw)) + raw + struct.pack("<Q", len(data)) + data
    digest = hashlib.sha256(body).digest()
    return _HEADER.pack(magic, version, len(sections), len(body), digest) + bytes(body)


def unpack(data: bytes, magic: bytes, versions: tuple[int, ...], what: str) -> tuple[int, dict[str, bytes]]:
    """(version, sections) from container bytes; `what` names the file in errors."""
    if len(data) < _HEADER.size:
        raise FormatError(f"{what}: truncated ({len(data)} bytes, header needs {_HEADER.size})")
    got_magic, version, count, length, digest = _HEADER.unpack_from(data)
    if got_magic != magic:
        raise FormatError(
            f"{what}: bad magic {got_magic!r}, expected {magic!r}", hint="is this the right kind of file?"
        )
    if version not in versions:
        raise VersionError(
            f"{what}: format version {version} is not supported (this dif reads {', '.join(map(str, versions))})",
            hint="re-create the file with this version of dif",
        )
    if count > MAX_SECTIONS or length > MAX_PAYLOAD:
        raise FormatError(f"{what}: absurd header ({count} sections, {length} payload bytes)")
    body = data[_HEADER.size :]
    if len(body) != length:
        raise FormatError(f"{what}: payload is {len(body)} bytes, header says {length} (truncated or padded)")
    if hashlib.sha256(body).digest() != digest:
        raise ChecksumError(f"{what}: checksum mismatch (file is corrupt)")
    sections: dict[str, bytes] = {}
    pos = 0
    for _ in range(count):
        if pos + 2 > length:
            raise FormatError(f"{what}: section table runs past the end")
        (nlen,) = struct.unpack_from("<H", body, pos)
        pos += 2
        if pos + nlen + 8 > length:
            raise FormatError(f"{what}: section name runs past the end")
        try:
            name = bytes(body[pos : pos + nlen]).decode()
        except UnicodeDecodeError:
            raise FormatError(f"{what}: section name is not utf-8") from None
        pos += nlen
        (dlen,) = struct.unpack_from("<Q", body, pos)
        pos += 8
        if pos + dlen > length:
            raise FormatError(f"{what}: section '{name}' runs past the end")
        if name in sections:
            raise FormatError(f"{what}: section '{name}' appears twice")
        sections[name] = bytes(body[pos : pos + dlen])
        pos += dlen
    if pos != length:
        raise FormatError(f"{what}: {length - pos} trailing bytes after the last section")
    return version, sections


@contextmanager
def open_atomic(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that appears at `path` complete or not at all: written as a temp file in the
    same folder, renamed over `path` when the block ends without error, removed otherwise. An
    `OSError` (no such folder, disk full, permissions) becomes a `DifError` naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
        tmp.replace(path)
    except OSError as exc:
        raise DifError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` via `open_atomic`: readers never see half a file."""
    with open_atomic(path) as f:
        f.write(data)


def read_bytes(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise FormatError(f"{what}: cannot read {path}: {exc.strerror}") from None
