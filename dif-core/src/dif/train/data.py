"""Training data: a folder of images, each with a caption `.txt` of the same stem (the kohya /
ai-toolkit convention), grouped into aspect-ratio buckets, with latents and text features cached.

Bad input is an error naming the file (an unreadable image, an image without a caption, an empty
caption folder): a run never trains on a silently shortened dataset.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from attrs import frozen

from dif.errors import UsageError
from dif.serialize.diftensor import load_tensors, save_tensors

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


class DataError(UsageError):
    """The training data folder has a file that cannot be used (named in the message)."""


@frozen
class Sample:
    image: Path
    caption: str
    width: int
    height: int


def scan_folder(folder: str | Path) -> list[Sample]:
    """Every image of `folder` (sorted by name) with its caption; `DataError` naming the first bad file."""
    from PIL import Image, UnidentifiedImageError

    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"{root}: training data folder not found")
    images = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not images:
        raise DataError(f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) in the training data folder")
    out = []
    for path in images:
        caption_file = path.with_suffix(".txt")
        if not caption_file.is_file():
            raise DataError(f"{path}: image has no caption file {caption_file.name}", hint="add one .txt per image")
        try:
            caption = caption_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{caption_file}: caption cannot be read ({exc})") from None
        try:
            with Image.open(path) as im:
                im.load()  # decode fully: a truncated file fails here, not mid-run
                width, height = im.size
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise DataError(f"{path}: image cannot be read ({type(exc).__name__}: {exc})") from None
        out.append(Sample(path, caption, width, height))
    return out


def bucket_sizes(resolution: int, multiple: int, *, max_aspect: float = 2.0) -> list[tuple[int, int]]:
    """(width, height) sizes of about resolution^2 pixels, sides multiples of `multiple`, aspect ratio
    up to `max_aspect`:1 either way, one per width step (square included)."""
    area = resolution * resolution
    sizes = set()
    for w in range(multiple, 4 * resolution + 1, multiple):
        h = max(multiple, int(round(area / w / multiple)) * multiple)
        if max(w / h, h / w) <= max_aspect + 1e-9:
            sizes.add((w, h))
    sizes.add((resolution // multiple * multiple,) * 2)
    return sorted(sizes)


def assign_bucket(sample: Sample, sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The size whose aspect ratio is closest (in log) to the image's."""
    aspect = math.log(sample.width / sample.height)
    return min(sizes, key=lambda s: (abs(math.log(s[0] / s[1]) - aspect), -s[0] * s[1]))


def bucket_pixels(sample: Sample, size: tuple[int, int]) -> np.ndarray:
    """(1, 3, H, W) float32 in [-1, 1]: the image scaled to cover `size` (LANCZOS) and centre-cropped."""
    from PIL import Image

    w, h = size
    with Image.open(sample.image) as im:
        rgb = im.convert("RGB")
    scale = max(w / rgb.width, h / rgb.height)
    rw, rh = max(w, round(rgb.width * scale)), max(h, round(rgb.height * scale))
    rgb = rgb.resize((rw, rh), Image.Resampling.LANCZOS)
    left, top = (rw - w) // 2, (rh - h) // 2
    arr = np.asarray(rgb.crop((left, top, left + w, top + h)), np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(arr.transpose(2, 0, 1)[None])


@frozen
class Encoded:
    """One sample as the model trains on it."""

    latents: np.ndarray
    text: np.ndarray
    size: tuple[int, int]


class FeatureCache:
    """Latents and text features of the training samples, each computed once. Text features are shared
    by every sample with the same caption (kept in memory: one cache holds one encoder, named by `key`,
    so the caption is all they depend on): N images with K distinct captions run the text encoder K
    times. With a `folder`, each sample's latents and text are also kept as one safetensors file under
    it, named by (image bytes, caption, size, key), so a restarted run encodes nothing again."""

    def __init__(self, folder: str | Path | None, key: str) -> None:
        self.folder = None if folder is None else Path(folder)
        self.key = key
        self._texts: dict[str, np.ndarray] = {}

    def _path(self, sample: Sample, size: tuple[int, int]) -> Path | None:
        if self.folder is None:
            return None
        h = hashlib.sha256()
        h.update(sample.image.read_bytes())
        h.update(f"|{sample.caption}|{size}|{self.key}".encode())
        return self.folder / f"{h.hexdigest()[:24]}.safetensors"

    def text(self, caption: str, encode_text: Callable[[str], np.ndarray]) -> np.ndarray:
        """The caption's text features: `encode_text(caption)` the first time, the same array after."""
        if caption not in self._texts:
            self._texts[caption] = encode_text(caption)
        return self._texts[caption]

    def get(
        self,
        sample: Sample,
        size: tuple[int, int],
        encode_image: Callable[[np.ndarray], np.ndarray],
        encode_text: Callable[[str], np.ndarray],
    ) -> Encoded:
        path = self._path(sample, size)
        if path is not None and path.is_file():
            tensors, _ = load_tensors(path)
            text = self._texts.setdefault(sample.caption, np.array(tensors["text"]))
            return Encoded(np.array(tensors["latents"]), text, size)
        latents = encode_image(bucket_pixels(sample, size))
        text = self.text(sample.caption, encode_text)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_tensors(path, {"latents": latents, "text": text}, {"image": str(sample.image)})
        return Encoded(latents, text, size)


@frozen
class DataOrder:
    """Which sample each micro-batch reads: epoch e visits the samples in the permutation drawn from
    (seed, e). The state (epoch, position) is saved in `.diftrain`, so a resumed run reads the same data."""

    seed: int
    count: int

    def index(self, epoch: int, position: int) -> int:
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.count)
        return int(perm[position])

    def advance(self, state: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(sample index, next state) for `state` = {"epoch", "position"}."""
        epoch, position = int(state.get("epoch", 0)), int(state.get("position", 0))
        idx = self.index(epoch, position)
        position += 1
        if position == self.count:
            epoch, position = epoch + 1, 0
        return idx, {"epoch": epoch, "position": position}
