"""Initial noise for sampling loops: seeded standard Gaussian arrays on the host, or the caller's
own noise from a safetensors file; `initial_latents` packs either as a pipeline's latents.

Where it sits: the first input of a denoising loop. Seeds drive one of three generators (`dif.rng`,
`--rng`): "numpy" (the default: `numpy.random.Generator(PCG64(seed)).standard_normal` in float32, the
same image with dif on every machine and backend), "torch-cpu" and "torch-cuda" (torch's own streams,
reproduced in numpy: the noise diffusers draws with `torch.Generator("cpu" | "cuda").manual_seed(seed)`,
so the same seed gives the same image as there). Another tool's noise can also be passed in as a
safetensors file (`--init-noise NOISE.safetensors` in the CLIs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError, UsageError

MAX_SEED = 2**64 - 1


def gaussian_noise(
    shape: Sequence[int], seed: int, dtype: DType | str = DType.F32, *, rng: str = "numpy"
) -> np.ndarray:
    """Standard normal noise of `shape` as `dtype` from generator `rng` (`dif.rng.RNGS`): "numpy" draws
    float32 from PCG64(seed) and casts; the torch generators draw in `dtype` as torch does."""
    from dif.rng import standard_normal

    if not 0 <= seed <= MAX_SEED:
        raise DifError(f"seed {seed} is out of range", hint=f"use an integer in [0, {MAX_SEED}]")
    return standard_normal(shape, seed, rng, DType(dtype).np)


def random_seed() -> int:
    """A fresh seed (from the OS) for runs without --seed; report it so the run can be repeated."""
    entropy = np.random.SeedSequence().entropy
    assert isinstance(entropy, int)
    return entropy % (2**32)


def load_noise_file(path: str | Path) -> np.ndarray:
    """The initial-noise tensor of a safetensors file: its only tensor, or the one named `noise` /
    `latents` (what `--save-latents` writes and diffusers' `latents` argument takes). `UsageError`
    naming the file when it holds NaN / infinite values."""
    from dif.weights import open_safetensors

    source = open_safetensors(path)
    names = source.names()
    pick = names[0] if len(names) == 1 else next((n for n in ("noise", "latents") if n in names), None)
    if pick is None:
        raise UsageError(f"{path}: holds {len(names)} tensors; name the noise tensor 'noise' or 'latents'")
    noise = np.array(source[pick])
    bad = int(noise.size - np.count_nonzero(np.isfinite(noise)))
    if bad:
        raise UsageError(
            f"{path}: tensor '{pick}' has {bad} NaN / infinite values of {noise.size}; initial noise must be finite",
            hint="save the noise again (what --save-latents wrote as 'noise' is finite)",
        )
    return noise


def initial_latents(
    init: np.ndarray | None,
    seed: int,
    *,
    unpacked: tuple[int, ...],
    packed: tuple[int, ...],
    pack: Callable[[np.ndarray], np.ndarray],
    dtype: DType,
    what: str,
    rng: str = "numpy",
) -> np.ndarray:
    """Packed initial latents of shape `packed` in `dtype`.

    Without `init`: `gaussian_noise(unpacked, seed, rng=rng)` (numpy: float32, then cast; torch-cpu /
    torch-cuda: drawn in `dtype`, as diffusers' pipelines call `randn_tensor(unpacked shape, generator,
    dtype=the transformer's dtype)` before packing), packed. With `init`: the
    caller's noise, as unpacked latents `unpacked` = (1, C, h, w) (the batch axis may be left out;
    packed in float32) or already packed. `what` names the image size in the error for any other
    shape, e.g. "1024x1024"."""
    if init is None:
        draw = DType.F32 if rng == "numpy" else dtype
        return pack(gaussian_noise(unpacked, seed, draw, rng=rng)).astype(dtype.np)
    arr = np.asarray(init)
    if arr.shape == unpacked[1:]:
        arr = arr[None]
    if arr.shape == unpacked:
        return pack(arr.astype(np.float32)).astype(dtype.np)
    if arr.shape == packed:
        return arr.astype(dtype.np)
    raise UsageError(
        f"initial noise has shape {list(arr.shape)}; for {what} it must be "
        f"{list(unpacked)} (diffusers' unpacked `latents`) or packed {list(packed)}"
    )
