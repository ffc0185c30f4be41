"""Seeded standard normal noise from three generators (`--rng`): numpy's PCG64 (dif's own, the same on
every machine), and torch's CPU and CUDA streams reproduced in numpy, so a seed gives the initial noise
diffusers / ComfyUI draw with `torch.Generator("cpu" | "cuda").manual_seed(seed)` (no torch needed).

Where it sits: under `dif.noise.gaussian_noise`, the first input of a denoising loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dif.errors import UsageError

RNGS = ("numpy", "torch-cpu", "torch-cuda")
"""Generator names (`--rng`)."""

TORCH_DTYPES = frozenset({"float32", "float64", "bfloat16", "float16"})


def standard_normal(
    shape: Sequence[int], seed: int, rng: str = "numpy", dtype: np.dtype | str = "float32"
) -> np.ndarray:
    """Standard normal noise of `shape` from generator `rng` seeded with `seed`, as `dtype`: the first draw of
    `NoiseStream(seed, rng)`.

    "numpy": PCG64(seed).standard_normal in float32, then cast (dif's stream, independent of `dtype`'s
    draw). "torch-cpu" / "torch-cuda": `torch.randn(shape, generator=..., dtype=dtype)` drawn in `dtype`
    as torch draws it (torch's bf16 stream is not the float32 one rounded on the CPU), see
    `dif.rng.torch_cpu` and `dif.rng.torch_cuda` (the launch of the GPU `DIF_TORCH_CUDA_GPU` describes,
    default an H100 / H200). `UsageError` naming `--rng` for another name."""
    return NoiseStream(seed, rng).standard_normal(shape, dtype)


class NoiseStream:
    """One seeded generator drawn from in turn, as a pipeline that takes several tensors from one
    `torch.Generator` does (MiniMax-H3: each keyframe's noise, then the video's, then the audio's): the k-th
    `standard_normal` call returns what the k-th `torch.randn(..., generator=g)` would (torch-cpu: MT19937
    and its cached normal carried over; torch-cuda: the Philox offset advanced as torch advances it), or the
    next values of one PCG64 stream (numpy)."""

    def __init__(self, seed: int, rng: str = "numpy") -> None:
        if rng not in RNGS:
            raise UsageError(f"unknown random generator '{rng}'", hint=f"--rng takes {', '.join(RNGS)}")
        self.rng = rng
        self._seed = seed
        self._numpy = np.random.Generator(np.random.PCG64(seed)) if rng == "numpy" else None
        self._cuda_offset = 0
        if rng == "torch-cpu":
            from dif.rng.torch_cpu import TorchCpuGenerator

            self._torch_cpu = TorchCpuGenerator(seed)

    def standard_normal(self, shape: Sequence[int], dtype: np.dtype | str = "float32") -> np.ndarray:
        dims = tuple(int(d) for d in shape)
        dt = np.dtype(dtype)
        if self._numpy is not None:
            return self._numpy.standard_normal(dims, dtype=np.float32).astype(dt, copy=False)
        if dt.name not in TORCH_DTYPES:
            raise UsageError(f"--rng {self.rng} draws float32, float64, bfloat16 or float16 noise, not {dt.name}")
        if self.rng == "torch-cpu":
            return self._torch_cpu.randn(dims, dt)
        if dt == np.float64:
            raise UsageError("--rng torch-cuda draws float32, bfloat16 or float16 noise (float64 is another kernel)")
        from dif.rng.torch_cuda import offset_advance, torch_cuda_randn

        sms, threads = torch_cuda_gpu()
        out = torch_cuda_randn(dims, self._seed, dt, sms=sms, threads_per_sm=threads, offset=self._cuda_offset)
        self._cuda_offset += offset_advance(math.prod(dims), sms, threads)
        return out


def torch_cuda_gpu() -> tuple[int, int]:
    """(SMs, threads per SM) of `DIF_TORCH_CUDA_GPU`; `UsageError` naming it for anything else."""
    from dif.env import DIF_TORCH_CUDA_GPU

    text = DIF_TORCH_CUDA_GPU.get() or ""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts) or int(parts[1]) < 256:
        raise UsageError(
            f"DIF_TORCH_CUDA_GPU={text!r} is not 'SMS,THREADS_PER_SM'",
            hint="e.g. 132,2048 (H100 / H200): torch.cuda.get_device_properties(0).multi_processor_count, "
            ".max_threads_per_multi_processor",
        )
    return int(parts[0]), int(parts[1])
