"""The image inputs of a klein edit, prepared as the reference pipelines prepare them before their VAE:
reference images (`Flux2KleinPipeline(image=[...])`), the img2img / inpainting source and its mask
(`Flux2KleinInpaintPipeline`). Generic resizing and cropping is `dif.media.image_input`'s; the sizes,
limits and order of the steps here are klein's.
"""

from __future__ import annotations

import math

import numpy as np

from dif.media.image_input import (
    InputImage,
    bilinear_downsample,
    binary_mask,
    center_crop,
    check_shape,
    floor_size,
    limit_area,
    resize_lanczos,
    signed_pixels,
)

MAX_REFERENCE_IMAGES = 4
"""klein edits with up to 4 reference images (BFL's model card)."""
MAX_IMAGE_AREA = 1024 * 1024
"""Reference and init images above this many pixels are first scaled down to it (the reference pipelines')."""


def reference_pixels(img: InputImage, pixels_per_token: int) -> np.ndarray:
    """A reference image as Flux2KleinPipeline feeds its VAE: (1, 3, H, W) float32 in [-1, 1], scaled
    to at most `MAX_IMAGE_AREA` pixels (LANCZOS), then centre-cropped to the token grid. `UsageError`
    for one under 64 pixels a side or more elongated than 8:1 (the pipeline's limits)."""
    check_shape(img, what="reference image")
    image = limit_area(img.image, MAX_IMAGE_AREA)
    return signed_pixels(center_crop(image, *floor_size(*image.size, pixels_per_token)))


def reference_size(img: InputImage, pixels_per_token: int) -> tuple[int, int]:
    """(width, height) `reference_pixels` and `init_pixels` give `img`, without resizing it."""
    w, h = img.size
    if w * h > MAX_IMAGE_AREA:
        scale = math.sqrt(MAX_IMAGE_AREA / (w * h))
        w, h = int(w * scale), int(h * scale)
    return floor_size(w, h, pixels_per_token)


def init_pixels(img: InputImage, pixels_per_token: int) -> np.ndarray:
    """An img2img / inpainting source as Flux2KleinInpaintPipeline feeds its VAE: (1, 3, H, W) float32 in
    [-1, 1], scaled to at most `MAX_IMAGE_AREA` pixels, then resized (LANCZOS, not cropped) to the token grid."""
    image = limit_area(img.image, MAX_IMAGE_AREA)
    return signed_pixels(resize_lanczos(image, *floor_size(*image.size, pixels_per_token)))


def mask_tokens(mask: InputImage, width: int, height: int, pixels_per_token: int) -> np.ndarray:
    """The inpainting mask per latent token, (1, h*w, 1) float32 (1 = repaint): resized to the image's
    `width` x `height` (LANCZOS), greyscale, binarised at 0.5, then bilinearly downsampled to the token
    grid, as Flux2KleinInpaintPipeline prepares it."""
    ppt = pixels_per_token
    values = binary_mask(resize_lanczos(mask.image, width, height))
    return bilinear_downsample(values, height // ppt, width // ppt).reshape(1, -1, 1)
