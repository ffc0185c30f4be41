"""Images a run reads (reference images, img2img sources, inpainting masks): decoded and checked before
any model loads, then resized, cropped and scaled the way diffusers' image processors do.

Where it sits: before a frontend's pipeline (the CLI's `-r`, `-i`, `--mask`; `dif.load(...)(images=)`).
`read_image` decodes (PIL) and names the file in every error; the other functions are the generic
pixel arithmetic (area limit with LANCZOS, floor to the token grid, centre crop, [-1, 1] scaling,
binarised masks and their bilinear downsampling), each in the order and float32 rounding of
`diffusers.image_processor.VaeImageProcessor`, so a frontend that composes them reproduces its
reference pipeline's tensors. Model facts (the token size, the area cap, how many images) stay in
the frontends.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import frozen

from dif.errors import UsageError

if TYPE_CHECKING:
    from PIL import Image

F32 = np.float32


@frozen(eq=False)
class InputImage:
    """A decoded image and the name errors and metadata give it (its path, or "<image N>" for an
    in-memory one). `image` keeps its own mode (RGB, RGBA, L, ...): resizing happens before the
    conversion to RGB, as the reference processors do."""

    name: str
    image: Image.Image

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        w, h = self.image.size
        return int(w), int(h)


def read_image(source: str | Path | Any, *, what: str, index: int = 0) -> InputImage:
    """`source` decoded: a file path, a PIL image, an (H, W[, 3|4]) uint8 array (or an `InputImage`). `UsageError`
    naming `what` (e.g. "reference image") and the file when it is missing or cannot be decoded."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, InputImage):
        return source
    if isinstance(source, Image.Image):
        return InputImage(f"<{what} {index + 1}>", source)
    if isinstance(source, np.ndarray):
        arr = source
        if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)):
            raise UsageError(
                f"{what} {index + 1}: an array must be (H, W), (H, W, 3) or (H, W, 4) uint8, "
                f"got {list(arr.shape)} {arr.dtype}"
            )
        return InputImage(
            f"<{what} {index + 1}>", Image.fromarray(arr[..., 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr)
        )
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"{what} {path}: no such file")
    try:
        with Image.open(path) as opened:
            opened.load()
            image = opened.copy()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise UsageError(
            f"{what} {path} cannot be decoded as an image ({type(exc).__name__}: {exc})",
            hint="give a PNG, JPEG or WebP file",
        ) from None
    return InputImage(str(path), image)


def check_shape(img: InputImage, *, what: str, min_side: int = 64, max_aspect: float = 8.0) -> None:
    """`UsageError` for an image smaller than `min_side` on a side or more elongated than `max_aspect`
    (the limits of diffusers' `Flux2ImageProcessor.check_image_input`)."""
    w, h = img.size
    if w < min_side or h < min_side:
        raise UsageError(f"{what} {img.name} is {w}x{h}; both sides must be at least {min_side} pixels")
    if max(w / h, h / w) > max_aspect:
        raise UsageError(f"{what} {img.name} is {w}x{h}; the aspect ratio must be at most {max_aspect:g}:1")


def limit_area(image: Image.Image, max_area: int) -> Image.Image:
    """`image` scaled by sqrt(max_area / area) with LANCZOS (each side truncated to an integer) when its
    area exceeds `max_area`; unchanged otherwise."""
    from PIL import Image

    w, h = image.size
    if w * h <= max_area:
        return image
    scale = math.sqrt(max_area / (w * h))
    return image.resize((int(w * scale), int(h * scale)), Image.Resampling.LANCZOS)


def floor_size(width: int, height: int, multiple: int) -> tuple[int, int]:
    """(width, height) each rounded down to a multiple of `multiple`."""
    return width // multiple * multiple, height // multiple * multiple


def center_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """The centred `width` x `height` window of `image` (left/top offsets rounded down)."""
    w, h = image.size
    left, top = (w - width) // 2, (h - height) // 2
    return image.crop((left, top, left + width, top + height))


def resize_lanczos(image: Image.Image, width: int, height: int) -> Image.Image:
    """`image` resized to `width` x `height` with LANCZOS (a copy when the size already is that)."""
    from PIL import Image

    return image.resize((width, height), Image.Resampling.LANCZOS)


def signed_pixels(image: Image.Image) -> np.ndarray:
    """(1, 3, H, W) float32 in [-1, 1]: RGB, uint8 / 255, then 2x - 1 (float32 throughout)."""
    arr = np.asarray(image.convert("RGB"), dtype=np.uint8).astype(F32) / F32(255.0)
    return np.ascontiguousarray((F32(2.0) * arr - F32(1.0)).transpose(2, 0, 1)[None])


def binary_mask(image: Image.Image) -> np.ndarray:
    """(H, W) float32 of 0 and 1: greyscale ("L"), / 255, then >= 0.5 is 1 (white = repaint)."""
    arr = np.asarray(image.convert("L"), dtype=np.uint8).astype(F32) / F32(255.0)
    return np.where(arr >= F32(0.5), F32(1.0), F32(0.0)).astype(F32)


def bilinear_downsample(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """(H, W) float32 -> (height, width) by bilinear interpolation without antialiasing, half-pixel
    centres (torch's `interpolate(mode="bilinear", align_corners=False)`)."""
    src_h, src_w = x.shape

    def taps(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scale = F32(n_in / n_out)
        pos = np.maximum(scale * (np.arange(n_out, dtype=F32) + F32(0.5)) - F32(0.5), F32(0.0)).astype(F32)
        i0 = np.minimum(np.floor(pos).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, (pos - i0.astype(F32)).astype(F32)

    y0, y1, ly = taps(height, src_h)
    x0, x1, lx = taps(width, src_w)
    ly, lx = ly[:, None], lx[None, :]
    top = (F32(1.0) - lx) * x[y0][:, x0] + lx * x[y0][:, x1]
    bottom = (F32(1.0) - lx) * x[y1][:, x0] + lx * x[y1][:, x1]
    return ((F32(1.0) - ly) * top + ly * bottom).astype(F32)
