"""Whole programs on OpenCL against the reference interpreter, and the executor following the plan:
arena vs per-value pool buffers, streamed weights where the plan's streaming schedule puts them,
nodes on the host exactly where the plan places them (hand-edited placements included), outputs as
the only read-backs, buffers returned to the pool on close."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from dif.errors import DifError, PlanBindingError, PlanError, WeightError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.placement import DEVICE, HOST
from dif.plan.planner import plan_program, restream
from dif.plan.streaming import streamable
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


def test_streamed_weights_sit_where_the_plans_streaming_schedule_puts_them(ocl) -> None:
    program = transformer_block("f32")
    inputs, weights = random_bindings(program)
    plan = plan_program(program, ocl.profile(), ocl.budget())
    ok = streamable(program)
    plan = restream(plan, program, [(f"param {p.name}", [p.name]) for p in program.params if p.name in ok])
    exe = ocl.prepare(program, plan, weights)
    steps = exe.steps
    uploads = {i: s for i, s in enumerate(steps) if type(s).__name__ == "Upload"}
    assert len(uploads) == len(ok) == len(plan.streaming.blocks)
    offsets = plan.streaming.offsets()
    assert sorted((u.dst.slot.key, u.dst.byte_offset) for u in uploads.values()) == sorted(
        ("stream", off) for off in offsets.values()
    )
    assert not any(k.key.startswith("w:") for k in exe.buffers)
    total = sum(w.nbytes for w in weights.values())
    assert plan.streaming.staging_bytes < total  # blocks take turns in the plan's slots
    # every upload comes after the last launch of the slot's previous tenant's readers
    position = {n: i for i, n in enumerate(plan.schedule)}
    at = {u.dst.byte_offset: i for i, u in uploads.items()}
    for block in plan.streaming.blocks:
        if block.after < 0:
            continue
        prev = plan.streaming.blocks[block.after]
        last_read = max(i for i, s in enumerate(steps) if i not in uploads and position[s.node_id] <= prev.last_use)
        assert at[offsets[block.params[0]]] > last_read
    _check(program, exe.run(inputs), interpret(program, inputs, weights))


def placed_chain() -> Program:
    """mul, add, neg, mul on f32[4, 8]: every node tiny, reading the input and the weight."""
    b = ProgramBuilder("placed")
    x = b.input("x", (4, 8), "f32")
    w = b.param("w", (8,), "f32")
    a = b.emit("mul", x, w)
    c = b.emit("add", a, x)
    d = b.emit("neg", c)
    b.output(b.emit("mul", d, a))
    return b.build()


def test_the_planner_places_tiny_host_known_nodes_by_the_profiles_threshold(fresh_backend) -> None:
    program = placed_chain()
    backend = fresh_backend(host_eval_max_bytes=4096)
    assert backend.profile().host_threshold_bytes == 4096
    plan = plan_program(program, backend.profile(), backend.budget())
    assert plan.placement == (HOST,) * 4
    assert fresh_backend(host_eval_max_bytes=0).profile().host_threshold_bytes is None


def test_the_executor_runs_nodes_where_the_plan_places_them(fresh_backend) -> None:
    program = placed_chain()
    inputs, weights = random_bindings(program)
    backend = fresh_backend(host_eval_max_bytes=4096)  # its profile would put every node on the host
    plan = plan_program(program, backend.profile(), backend.budget())
    runs = {}
    for placement in [(HOST,) * 4, (DEVICE,) * 4, (HOST, HOST, DEVICE, DEVICE), (HOST, DEVICE, DEVICE, DEVICE)]:
        edited = attrs.evolve(plan, placement=placement)
        exe = backend.prepare(program, edited, weights)
        assert [n.id for n in exe.host_nodes] == [n for n, p in zip(plan.schedule, placement, strict=True) if p == HOST]
        assert {s.node_id for s in exe.steps if type(s).__name__ == "Launch"} == {
            n for n, p in zip(plan.schedule, placement, strict=True) if p == DEVICE
        }
        runs[placement] = exe.run(inputs)[program.outputs[0]]
    want = runs[(DEVICE,) * 4]
    for placement, got in runs.items():
        np.testing.assert_array_equal(got, want, err_msg=f"placement {placement}")
    _check(program, {program.outputs[0]: want}, interpret(program, inputs, weights))


def test_host_results_are_written_into_their_planned_arena_slots(fresh_backend) -> None:
    program = placed_chain()
    inputs, weights = random_bindings(program)
    backend = fresh_backend(host_eval_max_bytes=0)  # its own profile places nothing on the host
    plan = plan_program(program, attrs.evolve(backend.profile(), host_threshold_bytes=4096), backend.budget())
    plan = attrs.evolve(plan, placement=(HOST, HOST, DEVICE, DEVICE))
    exe = backend.prepare(program, plan, weights)
    a, c = (program.nodes[i].results[0].name for i in (0, 1))  # read by nodes 3 and 2 on the device
    uploads = sorted((s.dst.slot.key, s.dst.byte_offset) for s in exe.steps if type(s).__name__ == "Upload")
    assert uploads == sorted(("arena", plan.buffer_by_name[name].offset) for name in (a, c))
    want = exe.run(inputs)
    backend.info = attrs.evolve(backend.info, max_alloc_bytes=plan.arena_bytes - 1)  # pool mode: own buffers
    pooled = backend.prepare(program, plan, weights)
    assert pooled.mode == "pool"
    np.testing.assert_array_equal(pooled.run(inputs)[program.outputs[0]], want[program.outputs[0]])


def test_a_host_node_reading_a_device_value_is_refused(ocl) -> None:
    program = placed_chain()
    _inputs, weights = random_bindings(program)
    plan = plan_program(program, ocl.profile(), ocl.budget())
    with pytest.raises(PlanError, match=r"node 1 \(add\) is placed on the host but reads %0"):
        ocl.prepare(program, attrs.evolve(plan, placement=(DEVICE, HOST, DEVICE, DEVICE)), weights)


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
