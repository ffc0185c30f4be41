"""Keyframe pixels -> the Qwen3-VL vision tower's `pixel_values` and `image_grid_thw`, in numpy (no torch).

Frontend stage before the vision-tower program, the image processor of the reference's fl2va text step
(`processor.image_processor(images=keyframes)`, transformers' Qwen2VLImageProcessor): smart_resize to
multiples of patch x merge within the pixel bounds, a bicubic resize only when the size changes (PIL, as
the processor's PIL backend; at MiniMax-H3's canvases, multiples of 32 above the minimum, it never does),
x / 255 in float64 then float32, (x - mean) / std in float32, and patches flattened in merge-block order
(block row, block col, in-block row, in-block col), each row (C, temporal, p, p) with the still image
repeated over `temporal_patch_size`.
"""

from __future__ import annotations

import math

import numpy as np

from dif.errors import UsageError
from dif_frontend_h3.vision_config import ImageProcessorConfig


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen's target size: each side rounded to a multiple of `factor`, then scaled (aspect kept) into
    [min_pixels, max_pixels]. Python's round (half to even), as the reference."""
    if max(height, width) / min(height, width) > 200:
        raise UsageError(f"a {width}x{height} picture is too elongated for Qwen3-VL (aspect ratio over 200)")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    if pixels.shape[:2] == (height, width):
        return pixels
    from PIL import Image

    return np.asarray(Image.fromarray(pixels).resize((width, height), resample=Image.Resampling.BICUBIC))


def patchify_image(image: np.ndarray, cfg: ImageProcessorConfig) -> np.ndarray:
    """(C, H, W) float32 -> (H/p * W/p, C * T * p * p) rows in merge-block order."""
    c, h, w = image.shape
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = h // p, w // p
    x = image.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (gh, gw, mh, mw, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], t, p, p))
    return np.ascontiguousarray(x.reshape(gh * gw, c * t * p * p), dtype=np.float32)


def preprocess_images(images: list[np.ndarray], cfg: ImageProcessorConfig) -> tuple[np.ndarray, np.ndarray]:
    """RGB (H, W, 3) uint8 pictures -> pixel_values (sum of patches, C T p p) float32 and image_grid_thw
    (n, 3) int64 ((1, H'/p, W'/p) per picture), rows of all pictures concatenated in order."""
    rows, grids = [], []
    mean = np.asarray(cfg.image_mean, np.float32)[:, None, None]
    std = np.asarray(cfg.image_std, np.float32)[:, None, None]
    for pixels in images:
        px = np.asarray(pixels, np.uint8)
        if px.ndim != 3 or px.shape[2] != 3:
            raise UsageError(f"a picture must be RGB (H, W, 3), got shape {px.shape}")
        h, w = smart_resize(px.shape[0], px.shape[1], cfg.factor, cfg.min_pixels, cfg.max_pixels)
        chw = _resize(px, h, w).transpose(2, 0, 1)
        x = (chw.astype(np.float64) * (1.0 / 255.0)).astype(np.float32)  # the processor rescales in float64
        x = ((x - mean) / std).astype(np.float32)
        rows.append(patchify_image(x, cfg))
        grids.append((1, h // cfg.patch_size, w // cfg.patch_size))
    return np.concatenate(rows), np.asarray(grids, dtype=np.int64)
