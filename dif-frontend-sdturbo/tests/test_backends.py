"""The embedded SD-Turbo (KL VAE and TAESD) on the OpenCL and CUDA backends against the CPU backend:
the seed document's validation bar on 0-255 pixels (mean |diff| < 0.05, max <= 1) in fp32, and the
latents within rel-L2 1e-4. CUDA also runs f16 and bf16 (finite, cosine >= 0.99 to the fp32 CPU image).
Each backend skips with its reason where it cannot run: OpenCL without a platform, or where the
platform's compiler cannot build a one-line kernel (this machine's PoCL 3.0 / LLVM 14 reports
"unknown target CPU 'generic'" for its virtual CPU); CUDA without a usable GPU."""

from __future__ import annotations

import numpy as np
import pytest

from dif.image_pipeline import ImageRequest
from dif.testing.backends import backend_skip_reason
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT
from dif_frontend_sdturbo.plugin import INFO

PROMPT = "a red fox sitting in the snow"


def _opencl_skip() -> str | None:
    try:
        from dif_backend_opencl.device import availability
    except ImportError as exc:
        return f"dif-backend-opencl is not installed ({exc})"
    avail = availability()
    if not avail.ok:
        return f"no OpenCL platform: {avail.reason}"
    import pyopencl as cl

    ctx = cl.create_some_context(interactive=False)
    try:
        cl.Program(ctx, "__kernel void k(__global float* a) { a[0] = 1.0f; }").build()
    except Exception as exc:  # noqa: BLE001 - the platform's compiler, not dif, is broken here
        last = [line for line in str(exc).splitlines() if "error" in line.lower()]
        return f"the OpenCL compiler cannot build a trivial kernel here ({(last or [str(exc)])[-1].strip()})"
    return None


def _run(backend: str, dtype: str, fast_vae: bool):  # type: ignore[no-untyped-def]
    pipe = INFO.pipeline(DEFAULT_CHECKPOINT, dtype=dtype, backend=backend, fast_vae=fast_vae)
    return pipe.generate(ImageRequest(PROMPT, seed=11, width=128, height=128))


def _check_against_cpu(backend: str, fast_vae: bool) -> None:
    ref = _run("cpu", "f32", fast_vae)
    got = _run(backend, "f32", fast_vae)
    diff = np.abs(got.pixels.astype(np.int32) - ref.pixels.astype(np.int32))
    assert diff.mean() < 0.05 and diff.max() <= 1, (diff.mean(), diff.max())
    err = np.linalg.norm(got.latents.astype(np.float64) - ref.latents) / np.linalg.norm(ref.latents)
    assert err <= 1e-4


@pytest.mark.opencl
@pytest.mark.parametrize("fast_vae", [False, True], ids=["kl-vae", "taesd"])
def test_opencl_matches_cpu(fast_vae: bool) -> None:
    if (why := _opencl_skip()) is not None:
        pytest.skip(why)
    _check_against_cpu("opencl", fast_vae)


@pytest.mark.cuda
@pytest.mark.parametrize("fast_vae", [False, True], ids=["kl-vae", "taesd"])
def test_cuda_matches_cpu(fast_vae: bool) -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(why)
    _check_against_cpu("cuda", fast_vae)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cuda_half_precision(dtype: str) -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(why)
    ref = _run("cpu", "f32", False).pixels.astype(np.float64).ravel()
    got = _run("cuda", dtype, False).pixels.astype(np.float64).ravel()
    cos = float(ref @ got / (np.linalg.norm(ref) * np.linalg.norm(got)))
    assert cos >= 0.99
