"""The fused backwards of glu, rms_norm and layer_norm (`glu_backward`, `rms_norm_backward`,
`layer_norm_backward`): each reference against
torch autograd (float64), each decomposition against its reference, and where autodiff emits them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dif.autodiff import grad_program
from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder
from dif.ops.registry import get_op
from dif.passes.legalize import legalize
from dif.target import TargetProfile
from dif.testing.backward import interpret_float64
from dif.testing.conformance import ConformanceCase, case_inputs, case_program, conformance_cases

OPS = ["glu_backward", "rms_norm_backward", "layer_norm_backward"]
CASES = conformance_cases(dtypes=(DType.F32,), ops=OPS)
BARE = TargetProfile(backend="bare", device="test", dtypes=("f32", "bf16", "f16"))  # declares no fused op
TORCH_ACTS = {"silu": ("silu", {}), "gelu": ("gelu", {}), "gelu_tanh": ("gelu", {"approximate": "tanh"})}


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _f64(case: ConformanceCase) -> list[np.ndarray]:
    return [np.asarray(a, np.float64) for a in case.case.operands]


def _reference(case: ConformanceCase, *operands: np.ndarray) -> np.ndarray:
    op = get_op(case.op)
    return op.reference(*operands, **op.check_attrs(case.case.attrs))


def _torch_forward(torch: Any, op: str, x: Any, params: list[Any], attrs: dict[str, Any]) -> Any:
    """The forward whose input gradient `op` is, in torch."""
    if op == "rms_norm_backward":
        w = params[0] + float(attrs.get("offset", 0.0)) if params else None
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight=w, eps=float(attrs["eps"]))
    if op == "layer_norm_backward":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), *params, eps=float(attrs["eps"]))
    a, b = x.chunk(2, dim=-1)
    name, kw = TORCH_ACTS[str(attrs["act"])]
    act = getattr(torch.nn.functional, name)
    return act(a, **kw) * b if attrs["gated_half"] == "first" else a * act(b, **kw)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_matches_torch_autograd(case: ConformanceCase) -> None:
    torch = pytest.importorskip("torch")
    x_np, g_np, *params = _f64(case)
    x = torch.tensor(x_np, requires_grad=True)
    y = _torch_forward(torch, case.op, x, [torch.tensor(p) for p in params], case.case.attrs)
    y.backward(torch.tensor(g_np))
    assert x.grad is not None
    got = _reference(case, x_np, g_np, *params)
    assert _rel(got, x.grad.numpy()) < 1e-12


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decomposition_matches_reference(case: ConformanceCase) -> None:
    program = case_program(case)
    chain, decisions = legalize(program, BARE)
    assert case.op not in chain.op_histogram() and len(decisions) == 1
    got = interpret_float64(chain, case_inputs(case))[chain.outputs[0]]
    want = _reference(case, *_f64(case))
    assert _rel(got, want) < 1e-12


def _grad_ops(op: str, shape: tuple[int, ...], wrt: list[str], **attrs: object) -> dict[str, int]:
    b = ProgramBuilder("block")
    x = b.input("x", shape, "bf16")
    params = [b.input("w", shape[-1:], "bf16")] if op in ("rms_norm", "layer_norm") else []
    y = b.emit(op, x, *params, **attrs)
    b.output(b.emit("reduce_sum", b.emit("mul", y, y), axes=tuple(range(len(shape)))))
    prog = b.build()
    return grad_program(prog, wrt, loss=prog.outputs[0]).program.op_histogram()


def test_autodiff_emits_one_node_per_glu() -> None:
    ops = _grad_ops("glu", (2, 5, 32), ["x"], act="silu", gated_half="first")
    assert ops.get("glu_backward") == 1 and "split" not in ops and "sigmoid" not in ops


def test_autodiff_emits_one_rms_norm_backward_and_the_weight_gradient_only_when_wanted() -> None:
    frozen = _grad_ops("rms_norm", (2, 5, 32), ["x"], eps=1e-6)
    assert frozen.get("rms_norm_backward") == 1 and "rsqrt" not in frozen
    trained = _grad_ops("rms_norm", (2, 5, 32), ["x", "w"], eps=1e-6)
    assert trained.get("rms_norm_backward") == 1 and trained.get("rsqrt") == 1


def test_autodiff_emits_one_layer_norm_backward() -> None:
    ops = _grad_ops("layer_norm", (2, 5, 32), ["x"], eps=1e-6)
    assert ops.get("layer_norm_backward") == 1 and "rsqrt" not in ops and "sub" not in ops
