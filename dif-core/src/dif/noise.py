"""Initial noise for sampling loops: seeded standard Gaussian arrays on the host.

Where it sits: the first input of a denoising loop. Seeds drive numpy's PCG64 generator
(`numpy.random.Generator(PCG64(seed)).standard_normal`, float32), so a seed reproduces the same
image with dif on every machine and backend; it does NOT reproduce the image diffusers makes
from the same seed (that needs torch's own generator). For exact parity with another tool, save
its initial noise to safetensors and pass it in (`--init-noise NOISE.safetensors` in the CLIs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError

MAX_SEED = 2**64 - 1


def gaussian_noise(shape: Sequence[int], seed: int, dtype: DType | str = DType.F32) -> np.ndarray:
    """Standard normal noise of `shape`, drawn in float32 from PCG64(seed), then cast to `dtype`."""
    if not 0 <= seed <= MAX_SEED:
        raise DifError(f"seed {seed} is out of range", hint=f"use an integer in [0, {MAX_SEED}]")
    rng = np.random.Generator(np.random.PCG64(seed))
    noise = rng.standard_normal(tuple(int(d) for d in shape), dtype=np.float32)
    return noise.astype(DType(dtype).np, copy=False)


def random_seed() -> int:
    """A fresh seed (from the OS) for runs without --seed; report it so the run can be repeated."""
    entropy = np.random.SeedSequence().entropy
    assert isinstance(entropy, int)
    return entropy % (2**32)
