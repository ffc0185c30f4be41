"""The fused attention backward (`sdpa_backward`): its reference against torch autograd (float64), its
decomposition against its reference, where autodiff emits it, and how `legalize` replaces it for a target
that does not run it."""

from __future__ import annotations

import numpy as np
import pytest

from dif.autodiff import GradProgram, grad_program
from dif.dtypes import DType
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ops.attention import sdpa_backward, sdpa_stats
from dif.passes.legalize import legalize
from dif.target import TargetProfile
from dif.testing.backward import interpret_float64
from dif.testing.conformance import ConformanceCase, case_inputs, case_program, conformance_cases

CASES = conformance_cases(dtypes=(DType.BF16, DType.F16), ops=["sdpa_backward"])
BARE = TargetProfile(backend="bare", device="test", dtypes=("f32", "bf16", "f16"))  # declares no fused op
RUNS_IT = TargetProfile(backend="fused", device="test", capabilities=("op:sdpa_backward",))


def _f64(case: ConformanceCase) -> list[np.ndarray]:
    return [np.asarray(a, np.float64) for a in case.case.operands]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_matches_torch_autograd(case: ConformanceCase) -> None:
    torch = pytest.importorskip("torch")
    q, k, v, _o, do = (torch.tensor(a, requires_grad=i < 3) for i, a in enumerate(_f64(case)[:5]))
    scale = float(case.case.attrs["scale"]) or None
    group = q.shape[2] // k.shape[2]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=group > 1
    ).transpose(1, 2)
    out.backward(do)
    got = sdpa_backward(*(a.detach().numpy() for a in (q, k, v, out, do)), scale=float(case.case.attrs["scale"]))
    for name, g, t in zip(("dq", "dk", "dv"), got, (q, k, v), strict=True):
        assert _rel(g, t.grad.numpy()) < 1e-12, name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decomposition_matches_reference(case: ConformanceCase) -> None:
    program = case_program(case)
    chain, decisions = legalize(program, BARE)
    assert "sdpa_backward" not in chain.op_histogram() and len(decisions) == 1
    assert chain.outputs == program.outputs and [v.name for v in chain.inputs] == [v.name for v in program.inputs]
    got = interpret_float64(chain, case_inputs(case))
    want = sdpa_backward(*_f64(case), scale=float(case.case.attrs["scale"]))
    for name, w in zip(chain.outputs, want, strict=True):
        assert _rel(got[name], w) < 1e-12, name


def test_legalize_leaves_a_program_the_target_runs() -> None:
    program = case_program(CASES[0])
    assert legalize(program, RUNS_IT) == (program, [])
    assert legalize(program, None)[0] is program  # the interpreter runs every op
    chain, [decision] = legalize(program, BARE)
    assert "target 'bare' does not declare op:sdpa_backward" in decision.why
    assert all("legalize" in p.transforms for p in chain.provenance.values())


def _attention_grad(dtype: str, shape: tuple[int, ...] = (1, 8, 2, 16), **attrs: object) -> GradProgram:
    """The gradient program of sum(sdpa(q, k, v, mask?; attrs)²) for q, k, v of `shape` [B, S, H, D]."""
    b = ProgramBuilder("attn")
    q, k, v = (b.input(n, shape, dtype) for n in "qkv")
    mask = b.input("mask", shape[:2], "bool") if attrs.pop("masked", False) else None
    y = b.emit("sdpa", q, k, v, mask, **attrs)
    b.output(b.emit("reduce_sum", b.emit("mul", y, y), axes=(0, 1, 2, 3)))
    prog = b.build()
    return grad_program(prog, ["q", "k", "v"], loss=prog.outputs[0])


def _grad_ops(dtype: str, d: int = 16, **attrs: object) -> dict[str, int]:
    return _attention_grad(dtype, (1, 8, 2, d), **attrs).program.op_histogram()


def test_autodiff_emits_the_fused_backward_only_where_it_is_defined() -> None:
    assert _grad_ops("bf16").get("sdpa_backward") == 1
    assert _grad_ops("f16", scale=0.2).get("sdpa_backward") == 1
    for why, hist in {
        "f32": _grad_ops("f32"), "head dim 12": _grad_ops("bf16", d=12),
        "key mask": _grad_ops("bf16", masked=True), "causal": _grad_ops("bf16", causal=True),
    }.items():  # fmt: skip
        assert "sdpa_backward" not in hist and hist.get("softmax") == 1, why


def test_fused_gradients_match_the_chain_in_bf16() -> None:
    """One bf16 attention's gradients from the fused reference and from the legalized chain (which rounds
    P and dS to bf16 between its steps): equal to bf16 precision."""
    grad = _attention_grad("bf16", (2, 16, 4, 32))
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal((2, 16, 4, 32)).astype(DType.BF16.np) for n in "qkv"}
    fused = interpret(grad.program, inputs, {})
    chain = interpret(legalize(grad.program, BARE)[0], inputs, {})
    for n in "qkv":
        out = grad.gradients[n]
        assert _rel(np.asarray(chain[out], np.float64), np.asarray(fused[out], np.float64)) < 2e-2, n


STATS_CASES = conformance_cases(dtypes=(DType.BF16,), ops=["sdpa_stats"])


@pytest.mark.parametrize("case", STATS_CASES, ids=lambda c: c.id)
def test_statistics_are_torch_logsumexp_and_the_decomposition_agrees(case: ConformanceCase) -> None:
    torch = pytest.importorskip("torch")
    q, k, v = _f64(case)
    scale = float(case.case.attrs["scale"]) or 1.0 / np.sqrt(q.shape[3])
    qt, kt = torch.tensor(q).transpose(1, 2), torch.tensor(k).transpose(1, 2)
    kt = kt.repeat_interleave(q.shape[2] // k.shape[2], dim=1)
    want = torch.logsumexp(qt @ kt.transpose(2, 3) * scale, dim=-1).numpy()
    o, lse = sdpa_stats(q, k, v, scale=float(case.case.attrs["scale"]))
    assert _rel(lse, want) < 1e-12
    chain = legalize(case_program(case), BARE)[0]
    got = interpret_float64(chain, case_inputs(case))
    assert _rel(got[chain.outputs[1]], want) < 1e-12 and _rel(got[chain.outputs[0]], o) < 1e-12


def test_the_forward_hands_its_statistics_to_the_backward() -> None:
    """In a bf16 training-style program (attention, a loss, its gradients), `reuse_attention_stats` turns
    the forward sdpa into sdpa_stats and feeds its statistics to sdpa_backward; the gradients do not change."""
    from dif.passes import optimize

    grad = _attention_grad("bf16", (1, 16, 4, 32))
    target = TargetProfile(backend="fused", device="test", capabilities=("op:sdpa_backward", "op:sdpa_stats"))
    out, decisions = optimize(grad.program, target=target, passes=["reuse_attention_stats"])
    hist = out.op_histogram()
    assert hist.get("sdpa_stats") == 1 and "sdpa" not in hist and hist["sdpa_backward"] == 1
    backward = next(n for n in out.nodes if n.op == "sdpa_backward")
    assert backward.operands[5] == next(n for n in out.nodes if n.op == "sdpa_stats").results[1].name
    assert [d.verdict for d in decisions] == ["applied"]
    rng = np.random.default_rng(1)
    inputs = {n: rng.standard_normal((1, 16, 4, 32)).astype(DType.BF16.np) for n in "qkv"}
    want, got = interpret(grad.program, inputs, {}), interpret(out, inputs, {})
    assert all(np.array_equal(got[o], want[o]) for o in grad.program.outputs)
    lacking, skipped = optimize(grad.program, target=RUNS_IT, passes=["reuse_attention_stats"])
    assert lacking is grad.program and "does not declare op:sdpa_stats" in skipped[0].reason
