"""The autodiff transform: a verified loss + gradients program, planned by the planner (peak stated),
frozen parameters without gradient work, per-block activation checkpointing recorded as a decision,
and gradients equal to float64 finite differences of the whole forward."""

from __future__ import annotations

import numpy as np
import pytest

from dif.autodiff import grad_program
from dif.autodiff.transform import RECOMPUTE
from dif.errors import DifError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers import linear, rms_norm
from dif.testing.backward import interpret_float64
from dif.verify import verify_program

D, H, T, BLOCKS = 5, 48, 64, 4  # widths chosen so only a weight gradient is a [H, D] matmul result


def _mlp(blocks: int = BLOCKS) -> Program:
    """x [T, D] -> `blocks` residual blocks (rms_norm, up [H, D], silu, down [D, H]) -> mean square loss."""
    b = ProgramBuilder("mlp")
    x = b.input("x", (T, D), "f32")
    for i in range(blocks):
        with b.scope(module="m", block=f"block.{i}", section="ffn"):
            h = rms_norm(b, x, f"block.{i}.norm", eps=1e-6)
            h = b.emit("silu", linear(b, h, f"block.{i}.up", H))
            x = b.emit("add", x, linear(b, h, f"block.{i}.down", D))
    with b.scope(module="m", block="loss"):
        loss = b.emit("reduce_mean", b.emit("square", x), axes=(0, 1))
    b.output(loss)
    return b.build()


def _weights(prog: Program) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {p.name: (rng.standard_normal(p.type.shape) * 0.3).astype(np.float32) for p in prog.params}


def _cpu():  # type: ignore[no-untyped-def]
    CpuBackend = pytest.importorskip("dif_backend_cpu", reason="the CPU backend is another distribution").CpuBackend  # noqa: N806

    return CpuBackend()


def test_loss_gradients_match_finite_differences_of_the_whole_forward() -> None:
    prog = _mlp(2)
    w = _weights(prog)
    x = np.random.default_rng(1).standard_normal((T, D)).astype(np.float32)
    names = [p.name for p in prog.params]
    g = grad_program(prog, names, loss=prog.outputs[0])
    verify_program(g.program)
    got = interpret_float64(g.program, {"x": x}, w)
    rng = np.random.default_rng(2)
    for name in names:
        for e in rng.choice(w[name].size, 5, replace=False):
            h = 1e-6
            plus, minus = dict(w), dict(w)
            plus[name] = w[name].astype(np.float64).copy()
            plus[name].flat[e] += h
            minus[name] = w[name].astype(np.float64).copy()
            minus[name].flat[e] -= h
            fd = (
                interpret_float64(prog, {"x": x}, plus)[prog.outputs[0]]
                - interpret_float64(prog, {"x": x}, minus)[prog.outputs[0]]
            ) / (2 * h)
            assert abs(float(fd) - float(got[g.gradients[name]].flat[e])) <= 1e-7, name


def test_plan_states_peak_and_frozen_parameters_get_no_gradient_work() -> None:
    prog = _mlp()
    cpu = _cpu()
    trainable = [p.name for p in prog.params if ".down." in p.name]
    frozen_shape = (H, D)  # the up projections' weights
    g = grad_program(prog, trainable, loss=prog.outputs[0])
    full = grad_program(prog, [p.name for p in prog.params], loss=prog.outputs[0])
    backward = g.program.nodes[len(prog.nodes) :]
    # a weight gradient is a matmul result of the weight's shape (or its transpose): none for the frozen up
    # projections
    grad_ops = ("matmul", "transpose")
    assert not any(r.type.shape == frozen_shape for n in backward for r in n.results if n.op in grad_ops)
    assert any(r.type.shape == frozen_shape for n in full.program.nodes for r in n.results if n.op in grad_ops)
    assert len(g.program.nodes) < len(full.program.nodes)
    assert list(g.gradients) == trainable
    plan = g.plan(cpu.profile(), cpu.budget())
    assert plan.peak_bytes > 0
    assert any(d.what.startswith("autodiff:") for d in plan.decisions)
    assert "not differentiated and get no gradient buffers" in next(
        d.why for d in plan.decisions if d.what.startswith("autodiff:")
    )
    # the CPU backend runs the planned step and agrees with the interpreter
    w = _weights(prog)
    x = np.random.default_rng(3).standard_normal((T, D)).astype(np.float32)
    got = cpu.prepare(g.program, plan, w).run({"x": x})
    want = interpret(g.program, {"x": x}, w)
    for name in g.program.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)


def test_checkpointing_recomputes_blocks_lowers_the_peak_and_keeps_gradients() -> None:
    prog = _mlp()
    cpu = _cpu()
    names = [p.name for p in prog.params]
    plain = grad_program(prog, names, loss=prog.outputs[0])
    ckpt = grad_program(prog, names, loss=prog.outputs[0], checkpoint=("block.*",))
    recomputes = [d for d in ckpt.decisions if d.what.startswith("checkpoint:")]
    assert [d.what.split()[2] for d in recomputes] == [f"block.{i}" for i in reversed(range(BLOCKS))]
    assert all("are not kept from the forward to the backward" in d.why for d in recomputes)
    tagged = [n for n in ckpt.program.nodes if RECOMPUTE in ckpt.program.provenance[n.id].transforms]
    assert len(tagged) == sum(1 for n in prog.nodes if prog.provenance[n.id].block.startswith("block."))
    p_plain = plain.plan(cpu.profile(), cpu.budget())
    p_ckpt = ckpt.plan(cpu.profile(), cpu.budget())
    assert p_ckpt.peak_bytes < p_plain.peak_bytes, (p_ckpt.peak_bytes, p_plain.peak_bytes)
    assert any(d.what.startswith("checkpoint: block block.0") for d in p_ckpt.decisions)
    w = _weights(prog)
    x = np.random.default_rng(4).standard_normal((T, D)).astype(np.float32)
    a = interpret(plain.program, {"x": x}, w)
    c = interpret(ckpt.program, {"x": x}, w)
    for name in names:  # the recompute is the same arithmetic: bit-identical gradients
        np.testing.assert_array_equal(a[plain.gradients[name]], c[ckpt.gradients[name]])


def test_bad_requests_are_named() -> None:
    prog = _mlp(1)
    with pytest.raises(DifError, match="'nope' is not an input or parameter"):
        grad_program(prog, ["nope"], loss=prog.outputs[0])
    b = ProgramBuilder("ids")
    ids = b.input("ids", (3,), "i64")
    b.output(b.emit("cast", ids, dtype="f32"))
    with pytest.raises(DifError, match="only float values have gradients"):
        grad_program(b.build(), ["ids"])
    with pytest.raises(DifError, match="must be a one-element value"):
        grad_program(prog, ["x"], loss="x")


def test_unconnected_gradient_is_an_explicit_zero_and_vjp_mode_takes_cotangents() -> None:
    b = ProgramBuilder("two")
    x = b.input("x", (2, 3), "f32")
    b.input("y", (2, 3), "f32")  # differentiated, but the output does not use it
    b.output(b.emit("mul", x, x))
    prog = b.build()
    g = grad_program(prog, ["x", "y"])
    assert g.cotangents == {prog.outputs[0]: "cotangent.0"}
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    ct = np.ones((2, 3), np.float32)
    out = interpret(g.program, {"x": xv, "y": xv, "cotangent.0": ct}, {})
    np.testing.assert_array_equal(out[g.gradients["x"]], 2 * xv)
    np.testing.assert_array_equal(out[g.gradients["y"]], np.zeros((2, 3), np.float32))
