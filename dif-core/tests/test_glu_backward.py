"""The fused glu backward (`glu_backward`): its reference against torch autograd (float64), its
decomposition against its reference, and where autodiff emits it."""

from __future__ import annotations

import numpy as np
import pytest

from dif.autodiff import grad_program
from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ops.norm import glu_backward
from dif.passes.legalize import legalize
from dif.target import TargetProfile
from dif.testing.backward import interpret_float64
from dif.testing.conformance import ConformanceCase, case_inputs, case_program, conformance_cases

CASES = conformance_cases(dtypes=(DType.F32,), ops=["glu_backward"])
BARE = TargetProfile(backend="bare", device="test", dtypes=("f32", "bf16", "f16"))  # declares no fused op
TORCH_ACTS = {"silu": ("silu", {}), "gelu": ("gelu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"})}


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _f64(case: ConformanceCase) -> list[np.ndarray]:
    return [np.asarray(a, np.float64) for a in case.case.operands]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_matches_torch_autograd(case: ConformanceCase) -> None:
    torch = pytest.importorskip("torch")
    x_np, g_np = _f64(case)
    attrs = case.case.attrs
    x = torch.tensor(x_np, requires_grad=True)
    a, b = x.chunk(2, dim=-1)
    name, kw = TORCH_ACTS[str(attrs["act"])]
    act = getattr(torch.nn.functional, name)
    y = act(a, **kw) * b if attrs["gated_half"] == "first" else a * act(b, **kw)
    y.backward(torch.tensor(g_np))
    assert x.grad is not None
    got = glu_backward(x_np, g_np, act=str(attrs["act"]), gated_half=str(attrs["gated_half"]))
    assert _rel(got, x.grad.numpy()) < 1e-12


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decomposition_matches_reference(case: ConformanceCase) -> None:
    program = case_program(case)
    chain, decisions = legalize(program, BARE)
    assert "glu_backward" not in chain.op_histogram() and len(decisions) == 1
    got = interpret_float64(chain, case_inputs(case))[chain.outputs[0]]
    attrs = case.case.attrs
    want = glu_backward(*_f64(case), act=str(attrs["act"]), gated_half=str(attrs["gated_half"]))
    assert _rel(got, want) < 1e-12


def test_autodiff_emits_one_node_per_glu() -> None:
    b = ProgramBuilder("ffn")
    x = b.input("x", (2, 5, 32), "bf16")
    y = b.emit("glu", x, act="silu", gated_half="first")
    b.output(b.emit("reduce_sum", b.emit("mul", y, y), axes=(0, 1, 2)))
    prog = b.build()
    ops = grad_program(prog, ["x"], loss=prog.outputs[0]).program.op_histogram()
    assert ops.get("glu_backward") == 1 and "split" not in ops and "sigmoid" not in ops
