"""Media output, images: decoded pixels -> PNG with generation metadata, written atomically.

Where it sits: the last stage of an image pipeline. Two text chunks are written:
  `parameters`  A1111-style text (prompt, "Negative prompt: ...", "Steps: 4, Sampler: ..., Seed: ...")
                that image viewers, A1111/Forge and civitai already parse;
  `dif`         the same settings as JSON, for tools (schema'd by the caller's dict).
The file appears complete or not at all (temp file in the same folder, then rename).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError
from dif.media.png_writer import png_bytes
from dif.serialize.container import write_atomic

JSON_KEY = "dif"
PARAMETERS_KEY = "parameters"


NARROW_FLOATS = frozenset(d.np for d in DType if d.is_float and d.itemsize < 4)


def to_uint8(image: np.ndarray, *, value_range: str = "-1,1") -> np.ndarray:
    """(H, W, C) or (C, H, W) float image -> (H, W, C) uint8.

    value_range "-1,1": x/2 + 0.5 first (a VAE's output); "0,1": as is. Then clamp to [0, 1] and
    round(x * 255), as diffusers' image processor does (ties to even, like torch/numpy round).
    The x/2 + 0.5 is taken in the image's own dtype when that is narrower than float32 (bf16, f16:
    each operation rounded, as the processor does on such a tensor), otherwise in float32.
    """
    src = np.asarray(image)
    arr = src.astype(np.float32)
    if arr.ndim != 3:
        raise DifError(f"expected one image of rank 3, got shape {list(arr.shape)}")
    if arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
        arr = arr.transpose(1, 2, 0)
    if value_range == "-1,1":
        half = np.float32(0.5)
        if src.dtype in NARROW_FLOATS:
            arr = (arr * half).astype(src.dtype).astype(np.float32)
            arr = (arr + half).astype(src.dtype).astype(np.float32)
        else:
            arr = arr * half + half
    elif value_range != "0,1":
        raise DifError(f"unknown value range '{value_range}'", hint="use '-1,1' or '0,1'")
    arr = np.clip(arr, 0.0, 1.0)
    return np.round(arr * np.float32(255.0)).astype(np.uint8)


def format_parameters(prompt: str, negative_prompt: str | None, settings: Mapping[str, Any]) -> str:
    """A1111 `parameters` text: prompt line(s), optional `Negative prompt:` line, then `Key: value`
    pairs joined by ", " (values containing ',' or ':' are JSON-quoted, as A1111 does)."""
    lines = [prompt]
    if negative_prompt:
        lines.append(f"Negative prompt: {negative_prompt}")
    pairs = []
    for key, value in settings.items():
        if value is None:
            continue
        text = str(value)
        if any(c in text for c in ",:\n"):
            text = json.dumps(text, ensure_ascii=False)
        pairs.append(f"{key}: {text}")
    if pairs:
        lines.append(", ".join(pairs))
    return "\n".join(lines)


def encode_png(
    pixels: np.ndarray, *, parameters: str | None = None, metadata: Mapping[str, Any] | None = None
) -> bytes:
    """PNG bytes of an (H, W, 3|4|1) uint8 image with the two metadata chunks (`png_writer`: every core)."""
    arr = np.asarray(pixels)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4):
        raise DifError(f"encode_png wants (H, W, 1|3|4) uint8 pixels, got {arr.dtype}{list(arr.shape)}")
    text = []
    if parameters is not None:
        text.append((PARAMETERS_KEY, parameters))
    if metadata is not None:
        text.append((JSON_KEY, json.dumps(dict(metadata), ensure_ascii=False, sort_keys=True)))
    return png_bytes(arr, text)


def write_png(
    path: str | Path,
    pixels: np.ndarray,
    *,
    parameters: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Encode and write atomically; returns the path. The folder must exist (no surprise mkdirs)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise DifError(f"cannot write {path}: folder {path.parent} does not exist")
    write_atomic(path, encode_png(pixels, parameters=parameters, metadata=metadata))
    return path


def read_png_metadata(path: str | Path) -> dict[str, Any]:
    """{'parameters': str | None, 'dif': dict | None, 'size': (W, H), 'mode': str} of a PNG."""
    from PIL import Image

    with Image.open(path) as image:
        text = dict(getattr(image, "text", {}))
        size, mode = image.size, image.mode
    raw = text.get(JSON_KEY)
    return {
        PARAMETERS_KEY: text.get(PARAMETERS_KEY),
        JSON_KEY: json.loads(raw) if raw else None,
        "size": size,
        "mode": mode,
    }
