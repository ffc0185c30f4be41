"""Seeded standard normal noise from three generators (`--rng`): numpy's PCG64 (dif's own, the same on
every machine), and torch's CPU and CUDA streams reproduced in numpy, so a seed gives the initial noise
diffusers / ComfyUI draw with `torch.Generator("cpu" | "cuda").manual_seed(seed)` (no torch needed).

Where it sits: under `dif.noise.gaussian_noise`, the first input of a denoising loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dif.errors import UsageError

RNGS = ("numpy", "torch-cpu", "torch-cuda")
"""Generator names (`--rng`)."""

TORCH_DTYPES = frozenset({"float32", "float64", "bfloat16", "float16"})


def standard_normal(
    shape: Sequence[int], seed: int, rng: str = "numpy", dtype: np.dtype | str = "float32"
) -> np.ndarray:
    """Standard normal noise of `shape` from generator `rng` seeded with `seed`, as `dtype`.

    "numpy": PCG64(seed).standard_normal in float32, then cast (dif's stream, independent of `dtype`'s
    draw). "torch-cpu" / "torch-cuda": `torch.randn(shape, generator=..., dtype=dtype)` drawn in `dtype`
    as torch draws it (torch's bf16 stream is not the float32 one rounded on the CPU), see
    `dif.rng.torch_cpu` and `dif.rng.torch_cuda` (the launch of the GPU `DIF_TORCH_CUDA_GPU` describes,
    default an H100 / H200). `UsageError` naming
    `--rng` for another name."""
    dims = tuple(int(d) for d in shape)
    dt = np.dtype(dtype)
    if rng == "numpy":
        generator = np.random.Generator(np.random.PCG64(seed))
        return generator.standard_normal(dims, dtype=np.float32).astype(dt, copy=False)
    if rng not in RNGS:
        raise UsageError(f"unknown random generator '{rng}'", hint=f"--rng takes {', '.join(RNGS)}")
    if dt.name not in TORCH_DTYPES:
        raise UsageError(f"--rng {rng} draws float32, float64, bfloat16 or float16 noise, not {dt.name}")
    if rng == "torch-cpu":
        from dif.rng.torch_cpu import torch_cpu_randn

        return torch_cpu_randn(dims, seed, dt)
    if dt == np.float64:
        raise UsageError("--rng torch-cuda draws float32, bfloat16 or float16 noise (float64 is another kernel)")
    from dif.rng.torch_cuda import torch_cuda_randn

    sms, threads = torch_cuda_gpu()
    return torch_cuda_randn(dims, seed, dt, sms=sms, threads_per_sm=threads)


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
