"""The optimizer on OpenCL: the profile declares the fused ops it lowers and reshape aliasing; an
optimized DiT block runs the fused kernels (the MLP's residual add in the down projection's GEMM) and
matches the unfused program; aliased reshapes
launch nothing and change no result; `dif.runtime.prepare` records the pass decisions in the plan;
rms_norm_rope falls back to two kernels when a row is too long for local memory."""

from __future__ import annotations

import numpy as np
import pytest

from dif.dtypes import DType
from dif.interp import interpret
from dif.passes import optimize
from dif.plan.plan import ALIAS_CAPABILITY
from dif.plan.planner import plan_program
from dif.runtime import prepare
from dif.testing.conformance import assert_case, case_program, conformance_cases
from dif.testing.tolerances import compare, tolerance_for
from dif_backend_opencl.lower import LOWERINGS

from .blocks import random_bindings, transformer_block


def test_profile_declares_the_fused_ops_and_aliasing(ocl) -> None:
    caps = ocl.profile().capabilities
    assert ALIAS_CAPABILITY in caps
    assert set(LOWERINGS.op_capabilities()) <= set(caps) and "op:*" not in caps


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_optimized_block_runs_fused_kernels_and_matches(ocl, dtype: str) -> None:
    program = transformer_block(dtype)
    optimized, decisions = optimize(program, target=ocl.profile())
    assert len(optimized.nodes) == len(program.nodes) - 5
    hist = optimized.op_histogram()
    assert (hist["norm_modulate"], hist["rms_norm_rope"], hist["gated_residual"], hist["linear_add"]) == (1, 2, 1, 1)
    assert "add" not in hist
    assert all(d.verdict == "applied" for d in decisions)
    inputs, weights = random_bindings(program)
    exe = ocl.prepare(optimized, plan_program(optimized, ocl.profile(), ocl.budget()), weights)
    kernels = {getattr(s, "kernel", None) for s in exe.steps}
    assert {"norm_modulate", "rms_norm_rope", "gated_residual", "gemm"} <= kernels
    assert not {"layer_norm", "modulate", "rope", "bin_mul", "bin_add"} & kernels
    (fused_linear,) = (n.id for n in optimized.nodes if n.op == "linear_add")
    assert [s.kernel for s in exe.steps if s.node_id == fused_linear] == ["gemm"]  # the add is its epilogue
    got = exe.run(inputs)
    fused_ref = interpret(optimized, inputs, weights)
    want = interpret(program, inputs, weights)
    for name in program.outputs:
        np.testing.assert_array_equal(fused_ref[name], want[name])  # the fused references are exact
        cmp = compare(got[name], want[name], tolerance_for(program.types[name].dtype, reduction=64))
        assert cmp.ok, f"{name}: {cmp.detail}"


def test_aliased_reshapes_launch_nothing_and_change_nothing(ocl) -> None:
    program = transformer_block("bf16")
    inputs, weights = random_bindings(program)
    aliased = plan_program(program, ocl.profile(), ocl.budget())
    copied = plan_program(program, ocl.profile(), ocl.budget(), alias=False)
    alias_nodes = {program.producers[b.name].id for b in aliased.buffers if b.alias_of is not None}
    reshapes = {n.id for n in program.nodes if n.op == "reshape"}
    assert alias_nodes and alias_nodes <= reshapes
    a, c = ocl.prepare(program, aliased, weights), ocl.prepare(program, copied, weights)
    assert not {s.node_id for s in a.steps} & alias_nodes
    assert {s.node_id for s in c.steps} >= alias_nodes
    assert a.launches == c.launches - len(alias_nodes)
    assert aliased.arena_bytes <= copied.arena_bytes
    got, want = a.run(inputs), c.run(inputs)
    for name in program.outputs:
        np.testing.assert_array_equal(got[name], want[name])


def test_runtime_prepare_optimizes_for_the_backend(ocl, monkeypatch: pytest.MonkeyPatch) -> None:
    program = transformer_block("f32")
    inputs, weights = random_bindings(program)
    monkeypatch.delenv("DIF_PASSES", raising=False)
    exe, plan = prepare(program, weights, ocl)
    whats = [d.what for d in plan.decisions]
    assert whats[0].startswith("passes: rope_before_concat, fuse_norm_rope, fuse_norm_modulate, fuse_gated_residual")
    assert "fuse_linear_residual" in whats[0]
    modulate = next(n for n in program.nodes if n.op == "modulate").results[0].name
    assert f"fuse_norm_modulate: applied 1 at {modulate}" in whats
    assert any(w.startswith("fuse_linear_residual: applied 1") for w in whats), whats
    assert any(w.startswith("views: ") and "reshape placed inside" in w for w in whats)
    assert len(plan.schedule) == len(program.nodes) - 5
    got = exe.run(inputs)
    monkeypatch.setenv("DIF_PASSES", "none")
    plain, plain_plan = prepare(program, weights, ocl)
    assert len(plain_plan.schedule) == len(program.nodes)
    want = plain.run(inputs)
    for name in program.outputs:
        cmp = compare(got[name], want[name], tolerance_for(program.types[name].dtype, reduction=64))
        assert cmp.ok, f"{name}: {cmp.detail}"


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_rms_norm_rope_rows_too_long_for_local_memory_use_two_kernels(fresh_backend, monkeypatch, dtype) -> None:
    import dif_backend_opencl.lower.fused as lower_fused

    monkeypatch.setattr(lower_fused, "MAX_LOCAL_HEAD_DIM", 8)
    backend = fresh_backend(host_eval_max_bytes=0)
    for case in conformance_cases(dtypes=(dtype,), ops=["rms_norm_rope"]):
        program = case_program(case)
        exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
        assert [s.kernel for s in exe.steps] == ["rms_norm", "rope"]
        assert_case(backend, case, strict=True)
