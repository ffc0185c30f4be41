"""Cheap previews while sampling (`--preview FILE --preview-every N`): packed latent tokens -> RGB by one
linear map per model, written atomically as a small image every N steps.

Where it sits: the pipeline's `on_step(step, total, latents)` callback (`dif.kit.sampling`); no model
program runs. The map is fitted by least squares against the checkpoint's own VAE decoder: random latents
(standard normal, constant over 2x2-token blocks so the decoder's spatial mixing matters less) are
decoded once, each token's pixel patch is averaged, and RGB = latents @ weight + bias is solved with a
small ridge term. `perf/fit_preview.py` fits the embedded checkpoints offline (the frontends ship the
result as preview_rgb.json in their package, used when the checkpoint's VAE file is that one); any other
checkpoint is fitted when a preview is first asked for (one decode of 32x32 tokens). How well a linear
map can stand in for the decoder depends on the VAE: the fit's R^2 on held-out latents is recorded with
it (the random-weight tiny VAEs are far from linear: R^2 ~0.15-0.5; see docs/sampling.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, frozen

from dif.errors import CheckpointError

Decode = Callable[[np.ndarray, int, int], np.ndarray]
"""(packed latents (1, gh * gw, C) in the run dtype, gh, gw) -> (gh * ppt, gw * ppt, 3) uint8."""

FIT_GRID, FIT_BLOCK, RIDGE = 32, 2, 0.3
PREVIEW_SIDE = 256  # previews are upscaled (nearest) to at least this many pixels on the longer side
PROJECTION_FILE = "preview_rgb.json"


@frozen(eq=False)
class PreviewProjection:
    """RGB in [-1, 1] of a packed latent token: tokens (N, C) @ weight (C, 3) + bias (3,). `source`
    says what it was fitted against; `r2` is the fit's R^2 on held-out latents."""

    weight: np.ndarray
    bias: np.ndarray
    source: str
    r2: float

    @property
    def channels(self) -> int:
        return int(self.weight.shape[0])

    def to_json(self) -> dict[str, Any]:
        return {
            "weight": self.weight.tolist(),
            "bias": self.bias.tolist(),
            "source": self.source,
            "r2_held_out": self.r2,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str) -> PreviewProjection:
        try:
            weight = np.asarray(data["weight"], np.float32)
            bias = np.asarray(data["bias"], np.float32)
            ok = weight.ndim == 2 and weight.shape[1] == 3 and bias.shape == (3,) and np.isfinite(weight).all()
            if not ok:
                raise ValueError("shapes")
            return cls(weight, bias, str(data.get("source", "")), float(data.get("r2_held_out", float("nan"))))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{where}: not a preview projection (weight (C, 3), bias (3,))") from None


def _block_latents(seed: int, grid: int, block: int, channels: int) -> np.ndarray:
    """(1, grid * grid, C) float32 standard normal tokens, constant over block x block tokens."""
    small = np.random.default_rng(seed).standard_normal((grid // block, grid // block, channels), dtype=np.float32)
    return small.repeat(block, 0).repeat(block, 1).reshape(1, grid * grid, channels)


def _patch_means(pixels: np.ndarray, grid: int) -> np.ndarray:
    """(grid * grid, 3) mean RGB in [-1, 1] of each token's pixel patch of (H, W, 3) uint8 pixels."""
    x = np.asarray(pixels, np.float64) / 127.5 - 1.0
    ppt = x.shape[0] // grid
    return x.reshape(grid, ppt, grid, ppt, 3).mean(axis=(1, 3)).reshape(-1, 3)


def _solve(x: np.ndarray, y: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray]:
    a = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)
    penalty = ridge * len(x) * np.diag(np.r_[np.ones(x.shape[1]), 0.0])  # the bias is not shrunk
    w = np.linalg.solve(a.T @ a + penalty, a.T @ y)
    return w[:-1], w[-1]


def fit_projection(
    decode: Decode, channels: int, dtype: np.dtype, *, source: str, samples: int = 1, grid: int = FIT_GRID
) -> PreviewProjection:
    """A preview projection fitted by ridge least squares on `samples` decodes of `grid` x `grid` random
    block latents (seeds 0..samples-1), R^2 measured on one more decode (seed `samples`)."""
    data = []
    for seed in range(samples + 1):
        latents = _block_latents(seed, grid, FIT_BLOCK, channels)
        data.append((latents[0].astype(np.float64), _patch_means(decode(latents.astype(dtype), grid, grid), grid)))
    x = np.concatenate([d[0] for d in data[:-1]])
    y = np.concatenate([d[1] for d in data[:-1]])
    weight, bias = _solve(x, y, RIDGE)
    x_out, y_out = data[-1]
    residual = ((x_out @ weight + bias - y_out) ** 2).sum()
    r2 = 1.0 - residual / max(((y_out - y_out.mean(axis=0)) ** 2).sum(), 1e-30)
    return PreviewProjection(weight.astype(np.float32), bias.astype(np.float32), source, round(float(r2), 4))


def preview_pixels(projection: PreviewProjection, latents: np.ndarray, grid_h: int, grid_w: int) -> np.ndarray:
    """(H, W, 3) uint8 preview of the first image of packed `latents` (B, gh * gw, C): each token's RGB,
    upscaled (nearest) so the longer side has at least `PREVIEW_SIDE` pixels."""
    tokens = np.asarray(latents[0], np.float32)
    rgb = tokens @ projection.weight + projection.bias
    image = np.clip(np.round((rgb.reshape(grid_h, grid_w, 3) + 1.0) * 127.5), 0, 255).astype(np.uint8)
    scale = max(1, -(-PREVIEW_SIDE // max(grid_h, grid_w)))
    return image.repeat(scale, axis=0).repeat(scale, axis=1)


@define
class PreviewWriter:
    """An `on_step` callback that writes `path` (atomically; format by extension) after every `every`-th
    step and after the last one."""

    path: Path
    every: int
    projection: PreviewProjection
    grid: tuple[int, int]
    written: int = 0

    def __call__(self, step: int, total: int, latents: np.ndarray) -> None:
        if step % self.every and step != total:
            return
        from dif.media.image_file import write_image

        write_image(self.path, preview_pixels(self.projection, latents, *self.grid))
        self.written += 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def packaged_projection(package_dir: Path, vae_file: Path | None) -> PreviewProjection | None:
    """The projection `perf/fit_preview.py` shipped in `package_dir` when `vae_file` is the VAE weights
    it was fitted against (same size and SHA-256), else None."""
    path = package_dir / PROJECTION_FILE
    if vae_file is None or not path.is_file() or not vae_file.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("vae_bytes") != vae_file.stat().st_size or data.get("vae_sha256") != _sha256(vae_file):
        return None
    return PreviewProjection.from_json(data, where=str(path))


def projection_for(pipe: Any) -> PreviewProjection:
    """The preview projection of a `dif.image_pipeline.TextToImagePipeline`'s checkpoint: the packaged one
    when its VAE is the one fitted offline, else fitted now against `pipe.decode` (one 32x32-token decode)."""
    import importlib

    package = importlib.import_module(type(pipe).__module__.split(".")[0])
    assert package.__file__ is not None
    root = getattr(getattr(pipe, "checkpoint", None), "root", None)
    vae_file = Path(root) / "vae" / "diffusion_pytorch_model.safetensors" if root is not None else None
    found = packaged_projection(Path(package.__file__).parent, vae_file)
    if found is not None:
        return found
    # the fit's decoder (another shape than the run's) is dropped again: it must not hold device memory
    # that the run's own programs are planned without (a TextToImagePipeline keeps them in `_programs`)
    programs: Any = getattr(pipe, "_programs", None)
    before = programs.keys() if programs is not None else set()
    fitted = fit_projection(pipe.decode, latent_channels(pipe), pipe.dtype.np, source=f"{root} (fitted at load)")
    if programs is not None:
        for key in programs.keys() - before:
            programs.discard(key)
    return fitted


def latent_channels(pipe: Any) -> int:
    """Channels of the pipeline's packed latent tokens (the noise it draws for a one-token grid)."""
    from dif.image_pipeline import ImageRequest

    return int(pipe.initial_noise(ImageRequest(""), 1, 1).shape[-1])


def preview_on_step(
    pipe: Any, path: str | Path, *, width: int | None = None, height: int | None = None, every: int = 1
) -> PreviewWriter:
    """A `PreviewWriter` for a `dif.load(...)` pipeline (or a frontend pipeline) at the image size a call
    will run (`width` / `height` as passed to it; None: the checkpoint's native size), for its `on_step=`:
    `pipe("a fox", width=512, height=384, on_step=preview_on_step(pipe, "live.png", width=512, height=384))`.
    `UsageError` for an extension dif cannot write."""
    from dif.media.image_file import image_format

    image_format(path)
    inner = getattr(pipe, "pipeline", pipe)
    native = inner.native_size
    w, h, _ = inner.fit_size(width or native, height or native)
    grid = (h // inner.pixels_per_token, w // inner.pixels_per_token)
    return PreviewWriter(Path(path), every, projection_for(inner), grid)
