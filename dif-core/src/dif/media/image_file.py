"""Image files by extension: PNG, JPEG, WebP, each with the run's metadata where the format has room for
it, written atomically; any other extension is refused before a run starts.

Where it sits: the last stage of an image pipeline (`dif.report.save_image_run`), and the CLI's option
checks (`image_format` on `-o` before anything loads). Metadata:
  PNG         `parameters` (A1111 text) and `dif` (JSON) text chunks (`dif.media.png`);
  JPEG, WebP  an EXIF block (big-endian TIFF): UserComment = the A1111 text, "UNICODE\\0" + UTF-16BE as
              A1111 writes it (its, civitai's and ComfyUI's readers look there); ImageDescription = the
              `dif` JSON (ASCII, non-ASCII characters escaped).
JPEG is baseline 4:2:0 at quality 95; WebP lossy at quality 95 (neither keeps the exact pixels: PNG does).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dif.errors import DifError, UsageError
from dif.media.png import encode_png
from dif.serialize.container import write_atomic

IMAGE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
"""Output extensions (lower case) -> format."""

QUALITY = 95
USER_COMMENT, IMAGE_DESCRIPTION, EXIF_IFD = 0x9286, 0x010E, 0x8769
UNICODE_PREFIX = b"UNICODE\0"


def image_format(path: str | Path) -> str:
    """The format `path`'s extension names (case-blind); `UsageError` naming the extension and the
    supported ones otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_FORMATS:
        shown = f"extension '{Path(path).suffix}'" if suffix else "no extension"
        raise UsageError(
            f"{path}: {shown} is not an image format dif writes",
            hint=f"use one of {', '.join(IMAGE_FORMATS)}",
        )
    return IMAGE_FORMATS[suffix]


def exif_bytes(parameters: str | None, metadata: Mapping[str, Any] | None) -> bytes:
    """A big-endian TIFF/EXIF block: IFD0 with ImageDescription (the JSON) and the Exif IFD pointer, the
    Exif IFD with UserComment (the A1111 text). Starts with "Exif\\0\\0" (a JPEG APP1 / WebP EXIF body)."""
    description = None if metadata is None else json.dumps(dict(metadata), ensure_ascii=True, sort_keys=True)
    comment = None if parameters is None else UNICODE_PREFIX + parameters.encode("utf-16-be")
    ifd0: list[tuple[int, int, int, bytes]] = []  # (tag, type, count, data)
    if description is not None:
        data = description.encode("ascii") + b"\0"
        ifd0.append((IMAGE_DESCRIPTION, 2, len(data), data))
    exif_ifd = [] if comment is None else [(USER_COMMENT, 7, len(comment), comment)]
    ifd0_size = 2 + 12 * (len(ifd0) + 1) + 4
    exif_at = 8 + ifd0_size
    exif_size = 2 + 12 * len(exif_ifd) + 4
    data_at = exif_at + exif_size
    blobs: list[bytes] = []

    def entries(items: list[tuple[int, int, int, bytes]]) -> bytes:
        nonlocal data_at
        out = b""
        for tag, kind, count, data in items:
            if len(data) <= 4:
                out += struct.pack(">HHI", tag, kind, count) + data.ljust(4, b"\0")
            else:
                out += struct.pack(">HHII", tag, kind, count, data_at)
                blobs.append(data + (b"\0" if len(data) % 2 else b""))
                data_at += len(blobs[-1])
        return out

    first = entries(ifd0)
    pointer = struct.pack(">HHII", EXIF_IFD, 4, 1, exif_at)
    head = struct.pack(">H", len(ifd0) + 1) + first + pointer + struct.pack(">I", 0)
    second = struct.pack(">H", len(exif_ifd)) + entries(exif_ifd) + struct.pack(">I", 0)
    return b"Exif\0\0" + b"MM\0\x2a" + struct.pack(">I", 8) + head + second + b"".join(blobs)


def encode_image(
    pixels: np.ndarray,
    fmt: str,
    *,
    parameters: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> bytes:
    """The bytes of (H, W, 3) uint8 `pixels` as `fmt` ("png" | "jpeg" | "webp") with the metadata."""
    if fmt == "png":
        return encode_png(pixels, parameters=parameters, metadata=metadata)
    from PIL import Image

    arr = np.asarray(pixels)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] != 3:
        raise DifError(f"a {fmt} image is written from (H, W, 3) uint8 pixels, got {arr.dtype}{list(arr.shape)}")
    buffer = io.BytesIO()
    exif = exif_bytes(parameters, metadata)
    if fmt == "jpeg":
        Image.fromarray(arr, mode="RGB").save(buffer, "JPEG", quality=QUALITY, exif=exif)
    elif fmt == "webp":
        Image.fromarray(arr, mode="RGB").save(buffer, "WEBP", quality=QUALITY, exif=exif)
    else:
        raise DifError(f"unknown image format '{fmt}'", hint="use png, jpeg or webp")
    return buffer.getvalue()


def write_image(
    path: str | Path,
    pixels: np.ndarray,
    *,
    parameters: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Encode `pixels` in the format of `path`'s extension (`image_format`) and write it atomically; the
    folder must exist."""
    path = Path(path)
    fmt = image_format(path)
    if not path.parent.is_dir():
        raise DifError(f"cannot write {path}: folder {path.parent} does not exist")
    write_atomic(path, encode_image(pixels, fmt, parameters=parameters, metadata=metadata))
    return path


def read_image_metadata(path: str | Path) -> dict[str, Any]:
    """{'parameters': str | None, 'dif': dict | None, 'size': (W, H), 'mode': str, 'format': str} of an
    image dif wrote (PNG text chunks, or the EXIF block of a JPEG / WebP)."""
    from PIL import Image

    with Image.open(path) as image:
        size, mode, fmt = image.size, image.mode, str(image.format)
        text = dict(getattr(image, "text", {}))
        exif = image.getexif()
        sub = exif.get_ifd(EXIF_IFD)
        comment = sub.get(USER_COMMENT)
        description = exif.get(IMAGE_DESCRIPTION)
    if fmt == "PNG":
        parameters, raw = text.get("parameters"), text.get("dif")
    else:
        parameters = None
        if isinstance(comment, bytes) and comment.startswith(UNICODE_PREFIX):
            parameters = comment[len(UNICODE_PREFIX) :].decode("utf-16-be")
        elif isinstance(comment, str):
            parameters = comment
        raw = description if isinstance(description, str) else None
    meta = json.loads(raw) if raw else None
    return {"parameters": parameters, "dif": meta, "size": size, "mode": mode, "format": fmt}
