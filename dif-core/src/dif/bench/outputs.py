"""Is a benchmark stage's output a real file? Decode it: PNG with Pillow, MP4 with PyAV when installed.

Where it sits: `dif.bench.runner` checks each stage's declared `outputs` after the process ends (outside the
timed wall), so a stage that exits 0 but writes nothing, or half a file, fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm")


def verify_output(path: str) -> dict[str, Any]:
    """{path, ok, verified, bytes, detail...}: `ok` False when the file is missing, empty or does not decode;
    `verified` False (with `detail`) when no decoder for its kind is installed."""
    record: dict[str, Any] = {"path": path}
    if not os.path.isfile(path):
        return {**record, "ok": False, "verified": False, "detail": "missing"}
    size = os.path.getsize(path)
    record["bytes"] = size
    if size == 0:
        return {**record, "ok": False, "verified": False, "detail": "empty file"}
    suffix = Path(path).suffix.lower()
    try:
        if suffix in IMAGE_SUFFIXES:
            return {**record, "ok": True, "verified": True, **_decode_image(path)}
        if suffix in VIDEO_SUFFIXES:
            try:
                import av  # type: ignore[import-not-found,unused-ignore]  # noqa: F401  (PyAV: optional)
            except ImportError:
                return {**record, "ok": True, "verified": False, "detail": "not verified: PyAV missing"}
            return {**record, "ok": True, "verified": True, **_decode_video(path)}
        if suffix == ".json":
            json.loads(Path(path).read_text())
            return {**record, "ok": True, "verified": True, "format": "json"}
    except Exception as exc:  # any decoder failure means the file is not what the stage promised
        return {**record, "ok": False, "verified": True, "detail": f"does not decode: {type(exc).__name__}: {exc}"}
    return {**record, "ok": True, "verified": False, "detail": f"not verified: no decoder for '{suffix or path}'"}


def _decode_image(path: str) -> dict[str, Any]:
    from PIL import Image

    with Image.open(path) as im:
        im.load()  # decodes every pixel; verify() alone would not
        return {"format": (im.format or "").lower(), "size": list(im.size), "mode": im.mode}


def _decode_video(path: str) -> dict[str, Any]:
    import av  # type: ignore[import-not-found,unused-ignore]

    with av.open(path) as container:
        streams = {s.type: s for s in container.streams}
        if "video" not in streams:
            raise ValueError("no video stream")
        video = container.streams.video[0]
        frames = sum(1 for _ in container.decode(video))
        if frames == 0:
            raise ValueError("no video frame decodes")
        return {
            "format": "mp4",
            "size": [video.codec_context.width, video.codec_context.height],
            "frames": frames,
            "codec": video.codec_context.name,
            "audio": "audio" in streams,
        }
