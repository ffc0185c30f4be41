"""The vectorized kernels at the sizes transformer blocks use (marker `cuda`), against the reference
interpreter: norm_modulate with 16 values per thread (rows of 4096), the GLU with 8 per thread,
attention with a 512-wide head (a VAE's mid block: cuBLASLt steps, or the wide flash kernel), and the
cuDNN convolution with and without bias."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.planner import plan_program

from .conftest import cuda_skip_reason

pytestmark = pytest.mark.cuda


def _run(program: Program, tol: float, **options: str) -> None:
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif_backend_cuda.device import CudaBackend

    backend = CudaBackend(**options)
    rng = np.random.default_rng(3)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs}
    want = interpret(program, inputs, {})[program.outputs[0]].astype(np.float64)
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    got = exe.run(inputs)[program.outputs[0]].astype(np.float64)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel <= tol, f"rel-L2 {rel:.2e}"


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_modulate_long_rows(kind: str) -> None:
    b = ProgramBuilder("norm_modulate")
    x = b.input("x", (1, 96, 4096), "bf16")
    s, t = b.input("s", (1, 1, 4096), "bf16"), b.input("t", (1, 1, 4096), "bf16")
    b.output(b.emit("norm_modulate", x, s, t, kind=kind, eps=1e-6))
    _run(b.build(), 1e-2)


@pytest.mark.parametrize("half", ["first", "second"])
def test_glu_vectorized(half: str) -> None:
    b = ProgramBuilder("glu")
    x = b.input("x", (3, 40, 2 * 1536), "bf16")
    b.output(b.emit("glu", x, act="silu", gated_half=half))
    _run(b.build(), 1e-2)


@pytest.mark.parametrize("gemm", ["auto", "nvrtc"])  # cuBLASLt S = QK^T / softmax / SV, or the wide flash kernel
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_attention_with_a_wide_head(dtype: str, gemm: str) -> None:
    b = ProgramBuilder("vae_attention")
    q, k, v = (b.input(n, (2, 256, 2, 512), dtype) for n in "qkv")
    b.output(b.emit("sdpa", q, k, v))
    _run(b.build(), 2e-2 if dtype == "bf16" else 1e-4, gemm=gemm)


@pytest.mark.parametrize("bias", [True, False])
def test_cudnn_convolution_matches(bias: bool) -> None:
    b = ProgramBuilder("conv")
    x = b.input("x", (1, 64, 40, 36), "bf16")
    w = b.input("w", (96, 64, 3, 3), "bf16")
    operands = (x, w, b.input("b", (96,), "bf16")) if bias else (x, w)
    b.output(b.emit("conv2d", *operands, padding=(1, 1, 1, 1)))
    _run(b.build(), 1e-2)
