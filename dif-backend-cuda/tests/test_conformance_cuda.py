"""The op-table conformance kit on the GPU (marker `cuda`): every case at f32 and bf16 against the
reference interpreter (and every differentiable case's backward program), on the default kernel choice
and on the portable NVRTC paths (GEMM, flash attention) and without graph capture. Skips with the reason
where no GPU is usable."""

from __future__ import annotations

from typing import Any

import pytest

from dif.testing.backward import assert_backward_case, backward_params
from dif.testing.conformance import assert_case, pytest_params

from .conftest import cuda_skip_reason

pytestmark = pytest.mark.cuda

_BACKENDS: dict[str, Any] = {}


def _backend(variant: str) -> Any:
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    if variant not in _BACKENDS:
        from dif_backend_cuda.device import CudaBackend

        options = {
            "default": {},
            "portable": {"gemm": "nvrtc", "sdpa": "flash"},
            "eager": {"graph": False},
        }[variant]
        _BACKENDS[variant] = CudaBackend(**options)
    return _BACKENDS[variant]


@pytest.mark.parametrize("case", pytest_params("cuda"))
def test_op(case: Any) -> None:
    assert_case(_backend("default"), case, strict=True)


@pytest.mark.parametrize("case", backward_params("cuda"))
def test_backward(case: Any) -> None:
    """Every differentiable case's VJP program (what `dif train` runs) against the interpreter."""
    assert_backward_case(_backend("default"), case)


@pytest.mark.parametrize("case", pytest_params("cuda-portable", ops=["linear", "matmul", "sdpa", "conv2d"]))
def test_op_portable_kernels(case: Any) -> None:
    assert_case(_backend("portable"), case, strict=True)


@pytest.mark.parametrize("case", pytest_params("cuda-eager", ops=["add", "softmax", "concat", "linear", "sdpa"]))
def test_op_without_graph(case: Any) -> None:
    assert_case(_backend("eager"), case, strict=True)


def test_graph_is_captured_and_replays_identically() -> None:
    import numpy as np

    from dif.ir.builder import ProgramBuilder
    from dif.plan.planner import plan_program

    backend = _backend("default")
    b = ProgramBuilder("graph-replay")
    x = b.input("x", (64, 96), "f32")
    w = b.param("w", (48, 96), "f32")
    h = b.emit("silu", b.emit("linear", x, w))
    b.output(b.emit("softmax", h))
    program = b.build()
    exe = backend.prepare(
        program,
        plan_program(program, backend.profile(), backend.budget()),
        {"w": np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)},
    )
    assert exe.graph is not None, exe.graph_error
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((64, 96)).astype(np.float32) for _ in range(2)]
    first = [exe.run({"x": v})[program.outputs[0]] for v in xs]
    again = [exe.run({"x": v})[program.outputs[0]] for v in xs]
    assert not np.array_equal(first[0], first[1])  # inputs really reach the graph
    for a, c in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, c)
