"""On-disk cache entries for what is expensive to make and cheap to keep (compiled kernels, library
algorithm choices): one file per key, written atomically, read back only when it is intact.

Backends call this at prepare. An entry is the bytes of one artifact behind a small header that names
the cache format, the key it was made for (everything the artifact depends on: GPU, driver and library
versions, source hash, problem shape ...) and the SHA-256 and size of the payload. A read that finds a
truncated, hand-edited or foreign file warns (`DifWarning`), deletes it and reports a miss, so the
caller rebuilds it: a cache entry is never trusted because of its name alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path

from dif.errors import DifWarning
from dif.serialize.container import write_atomic

MAGIC = b"DIFCACHE"
FORMAT = 1
_HEADER_LIMIT = 1 << 16  # a header is a few hundred bytes; more is not a dif cache file


def key_digest(key: Mapping[str, str]) -> str:
    """A short stable name for `key` (sorted JSON, SHA-256, 24 hex digits)."""
    text = json.dumps(dict(key), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def write_entry(path: Path, payload: bytes, key: Mapping[str, str]) -> None:
    """Store `payload` made for `key` at `path` (temp file + rename: a reader never sees half a file)."""
    header = json.dumps(
        {"format": FORMAT, "key": dict(key), "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)},
        sort_keys=True,
    ).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, MAGIC + len(header).to_bytes(4, "little") + header + payload)


def read_entry(path: Path, key: Mapping[str, str]) -> bytes | None:
    """The payload stored at `path` for `key`, or None when there is none. A file that is there but not
    an intact entry for exactly `key` is deleted with a `DifWarning` saying why, and None returned."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _discard(path, f"cannot be read ({exc})")
    problem = _check(data, key)
    if problem is not None:
        return _discard(path, problem)
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    return data[len(MAGIC) + 4 + size :]


def _check(data: bytes, key: Mapping[str, str]) -> str | None:
    """Why `data` is not an intact entry for `key` (None when it is)."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        return "is not a dif cache entry"
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    if size > _HEADER_LIMIT or start + size > len(data):
        return "is truncated"
    try:
        header = json.loads(data[start : start + size])
    except ValueError:
        return "has a damaged header"
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return "was written by another cache format"
    if header.get("key") != dict(key):
        return "was made for another key"
    payload = data[start + size :]
    if header.get("size") != len(payload):
        return f"is truncated ({len(payload)} of {header.get('size')} payload bytes)"
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return "does not match its checksum (edited or damaged)"
    return None


def _discard(path: Path, problem: str) -> None:
    warnings.warn(f"cache entry {path} {problem}; rebuilding it", DifWarning, stacklevel=3)
    with contextlib.suppress(OSError):  # a read-only cache: the rebuilt entry is simply not stored
        path.unlink()
    return None
