"""Whole programs on OpenCL against the reference interpreter, and the executor's placement rules:
arena vs per-value pool buffers, streamed weights, host evaluation of tiny host-known nodes,
outputs as the only read-backs, buffers returned to the pool on close."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from dif.errors import DifError, PlanBindingError, WeightError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.plan import STREAMED
from dif.plan.planner import plan_program
from dif.testing.tolerances import compare, tolerance_for

from .blocks import random_bindings, transformer_block, vae_block


def _check(program: Program, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name in program.outputs:
        t = program.types[name]
        cmp = compare(got[name], want[name], tolerance_for(t.dtype, reduction=64))
        assert cmp.ok, f"{program.name} output {name}: {cmp.detail}"


def _prepare(backend, program: Program, weights):  # type: ignore[no-untyped-def]
    return backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), weights)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("build", [transformer_block, vae_block], ids=["transformer", "vae"])
def test_block_matches_interpreter(ocl, build, dtype: str) -> None:
    program = build(dtype)
    inputs, weights = random_bindings(program)
    exe = _prepare(ocl, program, weights)
    assert exe.mode == "arena" and exe.host_nodes == []
    _check(program, exe.run(inputs), interpret(program, inputs, weights))


def test_repeated_runs_take_new_inputs(ocl) -> None:
    program = transformer_block("f32")
    inputs, weights = random_bindings(program, seed=1)
    exe = _prepare(ocl, program, weights)
    first = exe.run(inputs)
    other, _ = random_bindings(program, seed=2)
    second = exe.run(other)
    _check(program, second, interpret(program, other, weights))
    assert not np.allclose(first[program.outputs[0]], second[program.outputs[0]])
    _check(program, exe.run(inputs), first)


def test_host_evaluation_of_tiny_host_known_nodes(fresh_backend) -> None:
    program = vae_block("f32")
    inputs, weights = random_bindings(program)
    backend = fresh_backend(host_eval_max_bytes=8 << 10)
    exe = _prepare(backend, program, weights)
    on_host = {n.op for n in exe.host_nodes}
    assert "group_norm" in on_host and len(exe.host_nodes) < len(program.nodes)
    assert all(s.node_id not in {n.id for n in exe.host_nodes} for s in exe.steps)
    _check(program, exe.run(inputs), interpret(program, inputs, weights))


def test_params_only_nodes_are_evaluated_once(fresh_backend) -> None:
    b = ProgramBuilder("const")
    x = b.input("x", (64, 32), "f32")
    w = b.param("w", (32,), "f32")
    scale = b.emit("scalar_affine", w, scale=2.0, bias=1.0)  # depends on weights only
    b.output(b.emit("mul", x, scale))
    program = b.build()
    inputs, weights = random_bindings(program)
    exe = _prepare(fresh_backend(host_eval_max_bytes=1024), program, weights)
    assert exe.host_nodes == [] and set(exe.const_env) == {program.nodes[0].results[0].name}
    assert [s.kernel for s in exe.steps] == ["bin_mul"]
    _check(program, exe.run(inputs), interpret(program, inputs, weights))


def test_pool_mode_when_the_arena_exceeds_the_largest_allocation(fresh_backend) -> None:
    program = transformer_block("bf16")
    inputs, weights = random_bindings(program)
    backend = fresh_backend(host_eval_max_bytes=0)
    plan = plan_program(program, backend.profile(), backend.budget())
    backend.info = attrs.evolve(backend.info, max_alloc_bytes=plan.arena_bytes - 1)
    exe = backend.prepare(program, plan, weights)
    assert exe.mode == "pool"
    values = [k for k in exe.buffers if k.key.startswith("val:")]
    distinct = {id(exe.buffers[k]) for k in values}
    assert len(distinct) < len(values), "values whose lifetimes do not overlap should share pool buffers"
    _check(program, exe.run(inputs), interpret(program, inputs, weights))


def test_streamed_weights_are_uploaded_before_first_use(ocl) -> None:
    program = transformer_block("f32")
    inputs, weights = random_bindings(program)
    plan = plan_program(program, ocl.profile(), ocl.budget())
    plan = attrs.evolve(plan, residency={p.name: STREAMED for p in program.params})
    exe = ocl.prepare(program, plan, weights)
    uploads = [s for s in exe.steps if type(s).__name__ == "Upload"]
    assert len(uploads) == len(program.params)
    assert not any(k.key.startswith("w:") for k in exe.buffers)
    total = sum(w.nbytes for w in weights.values())
    assert exe.buffers[next(k for k in exe.buffers if k.key == "stream")].size < total  # lifetimes share bytes
    _check(program, exe.run(inputs), interpret(program, inputs, weights))


def test_only_outputs_are_read_back(ocl, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyopencl as cl

    program = transformer_block("f32")
    inputs, weights = random_bindings(program)
    exe = _prepare(ocl, program, weights)
    copies: list[str] = []
    real = cl.enqueue_copy

    def spy(queue, dest, src, **kw):  # type: ignore[no-untyped-def]
        copies.append("read" if isinstance(dest, np.ndarray) else "write" if isinstance(src, np.ndarray) else "d2d")
        return real(queue, dest, src, **kw)

    monkeypatch.setattr(cl, "enqueue_copy", spy)
    exe.run(inputs)
    assert copies.count("read") == len(program.outputs)
    assert copies.count("write") == len(program.inputs)


def test_outputs_may_be_inputs_or_weights(ocl) -> None:
    b = ProgramBuilder("passthrough")
    x = b.input("x", (3, 4), "bf16")
    w = b.param("w", (4,), "bf16")
    b.output(x, w, b.emit("add", x, w))
    program = b.build()
    inputs, weights = random_bindings(program)
    got = _prepare(ocl, program, weights).run(inputs)
    np.testing.assert_array_equal(got["x"], inputs["x"])
    np.testing.assert_array_equal(got["w"], weights["w"])
    _check(program, got, interpret(program, inputs, weights))


def test_close_returns_buffers_and_the_next_prepare_reuses_them(fresh_backend) -> None:
    backend = fresh_backend(host_eval_max_bytes=0)
    program = transformer_block("f32")
    inputs, weights = random_bindings(program)
    with _prepare(backend, program, weights) as exe:
        exe.run(inputs)
        assert backend.pool.live_bytes > 0
    assert backend.pool.live_bytes == 0
    with pytest.raises(DifError, match="was closed"):
        exe.run(inputs)
    made = backend.pool.allocations
    exe = _prepare(backend, program, weights)
    assert backend.pool.allocations == made
    _check(program, exe.run(inputs), interpret(program, inputs, weights))
    exe.close()
    assert backend.pool.trim() > 0 and backend.pool.idle_bytes == 0


def test_binding_errors_name_what_is_wrong(ocl) -> None:
    program = transformer_block("f32")
    inputs, weights = random_bindings(program)
    plan = plan_program(program, ocl.profile(), ocl.budget())
    with pytest.raises(WeightError, match="mod.w"):
        ocl.prepare(program, plan, {k: v for k, v in weights.items() if k != "mod.w"})
    with pytest.raises(PlanBindingError):
        ocl.prepare(vae_block("f32"), plan, weights)
    exe = ocl.prepare(program, plan, weights)
    with pytest.raises(DifError, match="input 'x'"):
        exe.run({**inputs, "x": inputs["x"].astype(np.float16)})
