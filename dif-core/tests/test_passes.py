"""Optimizer passes: each fusion applies where it should, respects the single-user conditions, skips
(with the reason) when the target lacks the fused op, appends its name to provenance, and leaves the
program's results bit-identical under the reference interpreter. Also the pass manager: plugin passes
through `register_passes`, DIF_PASSES selection, and failures of plugin passes."""

from __future__ import annotations

import pytest

import dif
from dif.errors import UsageError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.passes import (
    APPLIED,
    DEFAULT_PASSES,
    SKIPPED,
    PassDecision,
    fuse_gated_residual,
    fuse_norm_modulate,
    fuse_norm_rope,
    optimize,
    selected_passes,
    summarize,
    supports_op,
)
from dif.plugins.manager import isolated_plugins, register_plugin
from dif.runtime import prepare
from dif.target import RuntimeBudget, TargetProfile
from dif.testing.rewrites import assert_bit_identical, random_bindings
from dif.verify import verify_program

ALL = TargetProfile(backend="ref", device="unit", capabilities=("op:*",))
NONE = TargetProfile(backend="bare", device="unit")


def modulated(dtype: str = "f32", *, norm: str = "layer_norm", affine: bool = False) -> Program:
    """x [2, 5, 16] -> norm -> modulate(scale, shift [2, 1, 16]) -> output, built in a provenance scope."""
    b = ProgramBuilder("mod")
    x = b.input("x", (2, 5, 16), dtype)
    scale, shift = b.input("scale", (2, 1, 16), dtype), b.input("shift", (2, 1, 16), dtype)
    w = b.param("w", (16,), dtype) if affine else None
    with b.scope(module="m", block="blk0", section="norm1", tensors=("blk0.norm.weight",)):
        n = b.emit(norm, x, w, eps=1e-6)
    with b.scope(module="m", block="blk0", section="mod1"):
        y = b.emit("modulate", n, scale, shift)
    b.output(y)
    return b.build()


# -- fuse_norm_modulate ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norm_modulate_applies_and_is_exact(dtype: str, norm: str) -> None:
    program = modulated(dtype, norm=norm)
    out, decisions = optimize(program, target=ALL, passes=["fuse_norm_modulate"])
    assert out.op_histogram() == {"norm_modulate": 1}
    (node,) = out.nodes
    assert node.id == 0 and node.operands == ("x", "scale", "shift")
    assert node.attrs == {"kind": "layer" if norm == "layer_norm" else "rms", "eps": 1e-6}
    assert node.results == program.nodes[1].results  # the consumer's result, name and type
    assert [d.verdict for d in decisions] == [APPLIED]
    assert decisions[0].nodes == (0, 1) and decisions[0].value == program.outputs[0]
    assert_bit_identical(program, out)


def test_provenance_is_merged_and_the_pass_appended() -> None:
    out, _ = fuse_with(fuse_norm_modulate, modulated())
    prov = out.provenance[0]
    assert prov.transforms == ("fuse_norm_modulate",)
    assert (prov.module, prov.block, prov.section) == ("m", "blk0", "mod1")  # the consumer's place
    assert prov.tensors == ("blk0.norm.weight",)  # the absorbed norm's checkpoint tensors stay
    again, _ = optimize(out, target=ALL)  # nothing left to fuse: same object back
    assert again is out


def fuse_with(fn, program: Program, target: TargetProfile | None = ALL) -> tuple[Program, list[PassDecision]]:  # type: ignore[no-untyped-def]
    return optimize(program, target=target, passes=[fn])


def test_norm_with_a_second_user_or_as_output_is_not_fused() -> None:
    b = ProgramBuilder("two")
    x, s, t = b.input("x", (3, 8), "f32"), b.input("s", (8,), "f32"), b.input("t", (8,), "f32")
    n = b.emit("layer_norm", x)
    b.output(b.emit("modulate", n, s, t), b.emit("neg", n))
    out, decisions = fuse_with(fuse_norm_modulate, b.build())
    assert "norm_modulate" not in out.op_histogram()
    assert [(d.verdict, d.reason) for d in decisions] == [(SKIPPED, "%0 has 2 users")]

    b = ProgramBuilder("out")
    x, s, t = b.input("x", (3, 8), "f32"), b.input("s", (8,), "f32"), b.input("t", (8,), "f32")
    n = b.emit("layer_norm", x)
    b.output(b.emit("modulate", n, s, t), n)
    out, decisions = fuse_with(fuse_norm_modulate, b.build())
    assert out.op_histogram() == {"layer_norm": 1, "modulate": 1}
    assert decisions[0].reason == "%0 is a program output"


def test_affine_norm_and_norm_as_scale_are_not_fused() -> None:
    out, decisions = fuse_with(fuse_norm_modulate, modulated(affine=True))
    assert out.op_histogram() == {"layer_norm": 1, "modulate": 1}
    assert decisions[0].verdict == SKIPPED and "affine" in decisions[0].reason
    b = ProgramBuilder("as-scale")
    x = b.input("x", (3, 8), "f32")
    n = b.emit("layer_norm", x)
    b.output(b.emit("modulate", x, n, x))  # the norm feeds `scale`: not the pattern, no decision
    out, decisions = fuse_with(fuse_norm_modulate, b.build())
    assert out.op_histogram() == {"layer_norm": 1, "modulate": 1} and decisions == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("weight", ["x's dtype", "f32"])
def test_a_weighted_rms_norm_becomes_rms_norm_modulate_and_is_exact(dtype: str, weight: str) -> None:
    """Krea 2's adaptive norm: a weighted rms_norm (offset 1, the weight in x's dtype or pinned to f32) under a
    modulate becomes one rms_norm_modulate; rounded before its weight (Qwen's order), it stays as it is."""
    b = ProgramBuilder("weighted")
    x = b.input("x", (2, 5, 16), dtype)
    scale, shift = b.input("scale", (2, 1, 16), dtype), b.input("shift", (2, 1, 16), dtype)
    w = b.param("w", (16,), dtype if weight == "x's dtype" else "f32")
    b.output(b.emit("modulate", b.emit("rms_norm", x, w, eps=1e-5, offset=1.0), scale, shift))
    program = b.build()
    out, decisions = fuse_with(fuse_norm_modulate, program)
    assert out.op_histogram() == {"rms_norm_modulate": 1}
    (node,) = out.nodes
    assert node.operands == ("x", "w", "scale", "shift") and node.attrs == {"eps": 1e-5, "offset": 1.0}
    assert [(d.verdict, d.reason) for d in decisions] == [(APPLIED, "rms_norm + modulate -> rms_norm_modulate")]
    assert_bit_identical(program, out)
    b = ProgramBuilder("qwen-order")
    x = b.input("x", (3, 8), dtype)
    s, t = b.input("s", (8,), dtype), b.input("t", (8,), dtype)
    n = b.emit("rms_norm", x, b.param("w", (8,), dtype), eps=1e-6, round_before_weight=True)
    out, decisions = fuse_with(fuse_norm_modulate, (b.output(b.emit("modulate", n, s, t)), b.build())[1])
    assert out.op_histogram() == {"rms_norm": 1, "modulate": 1} and "rounds before its weight" in decisions[0].reason


def test_fusion_is_skipped_when_the_target_lacks_the_op() -> None:
    program = modulated()
    out, decisions = fuse_with(fuse_norm_modulate, program, NONE)
    assert out is program
    assert decisions[0].verdict == SKIPPED
    assert decisions[0].reason == "target 'bare' does not declare op:norm_modulate"
    only = TargetProfile(backend="some", device="unit", capabilities=("op:norm_modulate",))
    assert fuse_with(fuse_norm_modulate, program, only)[0].op_histogram() == {"norm_modulate": 1}
    assert fuse_with(fuse_norm_modulate, program, None)[0].op_histogram() == {"norm_modulate": 1}
    assert supports_op(ALL, "anything") and not supports_op(NONE, "norm_modulate")


# -- fuse_gated_residual --------------------------------------------------------------------------


def residual(dtype: str = "f32", *, swap: bool = False, x_shape: tuple[int, ...] = (2, 5, 16)) -> Program:
    b = ProgramBuilder("res")
    x = b.input("x", x_shape, dtype)
    gate, y = b.input("gate", (2, 1, 16), dtype), b.input("y", (2, 5, 16), dtype)
    with b.scope(block="blk3"):
        m = b.emit("mul", gate, y)
        b.output(b.emit("add", m, x) if swap else b.emit("add", x, m))
    return b.build()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("swap", [False, True])
def test_gated_residual_applies_in_either_order_and_is_exact(dtype: str, swap: bool) -> None:
    program = residual(dtype, swap=swap)
    out, decisions = fuse_with(fuse_gated_residual, program)
    assert out.op_histogram() == {"gated_residual": 1}
    assert out.nodes[0].operands == ("x", "gate", "y")
    assert out.provenance[0].transforms == ("fuse_gated_residual",) and out.provenance[0].block == "blk3"
    assert [d.verdict for d in decisions] == [APPLIED]
    assert_bit_identical(program, out)


def test_gated_residual_with_a_smaller_residual_broadcasts_like_the_add() -> None:
    program = residual("bf16", x_shape=(16,))
    out, _ = fuse_with(fuse_gated_residual, program)
    assert out.op_histogram() == {"gated_residual": 1}
    assert_bit_identical(program, out)


def test_gated_residual_single_user_and_type_conditions() -> None:
    b = ProgramBuilder("shared-mul")
    x, g = b.input("x", (4, 8), "f32"), b.input("g", (4, 8), "f32")
    m = b.emit("mul", g, x)
    b.output(b.emit("add", x, m), b.emit("exp", m))
    out, decisions = fuse_with(fuse_gated_residual, b.build())
    assert out.op_histogram() == {"add": 1, "exp": 1, "mul": 1}
    assert decisions[0].verdict == SKIPPED and decisions[0].reason == "%0 has 2 users"

    b = ProgramBuilder("square")
    x = b.input("x", (4, 8), "f32")
    m = b.emit("mul", x, x)
    b.output(b.emit("add", m, m))  # the product is both addends
    out, decisions = fuse_with(fuse_gated_residual, b.build())
    assert "gated_residual" not in out.op_histogram() and "appears 2 times" in decisions[0].reason

    b = ProgramBuilder("ints")
    i, j = b.input("i", (4,), "i32"), b.input("j", (4,), "i32")
    b.output(b.emit("add", i, b.emit("mul", i, j)))
    out, decisions = fuse_with(fuse_gated_residual, b.build())
    assert "gated_residual" not in out.op_histogram()
    assert "does not type-check" in decisions[0].reason and "float" in decisions[0].reason


def test_gated_residual_picks_the_single_use_product_of_two() -> None:
    b = ProgramBuilder("two-muls")
    x, g = b.input("x", (4, 8), "f32"), b.input("g", (4, 8), "f32")
    shared = b.emit("mul", x, x)
    own = b.emit("mul", g, x)
    b.output(b.emit("add", own, shared), shared)  # the second operand is an output: use the first
    program = b.build()
    out, decisions = fuse_with(fuse_gated_residual, program)
    assert out.op_histogram() == {"gated_residual": 1, "mul": 1}
    assert out.nodes[1].operands == ("%0", "g", "x")
    assert [d.verdict for d in decisions] == [APPLIED]
    assert_bit_identical(program, out)


# -- fuse_norm_rope -------------------------------------------------------------------------------


def qk_rope(dtype: str = "f32", *, weight: bool = True, round_before_weight: bool = False) -> Program:
    b = ProgramBuilder("rope")
    q = b.input("q", (1, 6, 2, 16), dtype)
    cos, sin = b.input("cos", (6, 12), "f32"), b.input("sin", (6, 12), "f32")
    w = b.param("norm_q.weight", (16,), dtype) if weight else None
    with b.scope(block="single.0", section="attn", tensors=("norm_q.weight",)):
        n = b.emit("rms_norm", q, w, eps=1e-5, offset=0.5, round_before_weight=round_before_weight)
        b.output(b.emit("rope", n, cos, sin, mode="pairs"))
    return b.build()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("round_before_weight", [False, True])
def test_norm_rope_applies_and_is_exact(dtype: str, round_before_weight: bool) -> None:
    program = qk_rope(dtype, round_before_weight=round_before_weight)
    out, decisions = fuse_with(fuse_norm_rope, program)
    (node,) = out.nodes
    assert node.op == "rms_norm_rope" and node.operands == ("q", "norm_q.weight", "cos", "sin")
    assert node.attrs == {"eps": 1e-5, "offset": 0.5, "round_before_weight": round_before_weight, "mode": "pairs"}
    assert out.provenance[0].transforms == ("fuse_norm_rope",) and out.provenance[0].tensors == ("norm_q.weight",)
    assert decisions[0].verdict == APPLIED
    assert_bit_identical(program, out)


def test_norm_rope_needs_a_weighted_single_use_norm() -> None:
    out, decisions = fuse_with(fuse_norm_rope, qk_rope(weight=False))
    assert "rms_norm_rope" not in out.op_histogram() and decisions[0].reason == "rms_norm has no weight"
    out, decisions = fuse_with(fuse_norm_rope, qk_rope(), NONE)
    assert "rms_norm_rope" not in out.op_histogram() and "op:rms_norm_rope" in decisions[0].reason


# -- the manager ----------------------------------------------------------------------------------


def block(b: ProgramBuilder, h: Var, i: int) -> Var:
    """A miniature DiT block: modulated norm, per-head norm + rope, gated residual."""
    d = h.shape[-1]
    scale, shift, gate = (b.input(f"{n}{i}", (1, 1, d), h.dtype) for n in ("scale", "shift", "gate"))
    n = b.emit("modulate", b.emit("layer_norm", h), scale, shift)
    q = b.emit("reshape", n, shape=(1, h.shape[1], 2, d // 2))
    cos, sin = (b.input(f"{n}{i}", (h.shape[1], 8), "f32") for n in ("cos", "sin"))
    q = b.emit("rope", b.emit("rms_norm", q, b.param(f"w{i}", (d // 2,), h.dtype)), cos, sin, mode="half")
    y = b.emit("linear", b.emit("reshape", q, shape=h.shape), b.param(f"o{i}", (d, d), h.dtype))
    return b.emit("add", h, b.emit("mul", gate, y))


def mini_dit(dtype: str = "f32", blocks: int = 2) -> Program:
    b = ProgramBuilder("mini")
    h = b.input("h", (1, 4, 16), dtype)
    for i in range(blocks):
        h = block(b, h, i)
    b.output(h)
    return b.build()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_default_pipeline_fuses_everything_and_keeps_results(dtype: str) -> None:
    program = mini_dit(dtype)
    out, decisions = optimize(program, target=ALL)
    verify_program(out)
    assert [n.id for n in out.nodes] == list(range(len(out.nodes)))
    assert len(out.nodes) == len(program.nodes) - 6
    assert out.op_histogram() == {"gated_residual": 2, "linear": 2, "norm_modulate": 2, "reshape": 4,
                                  "rms_norm_rope": 2}  # fmt: skip
    # mini_dit has no concat before a rope, no group_norm (fuse_group_norm_silu: test_norm_act_pass.py), no
    # residual add of a linear's result (its linears feed gated residuals; test_linear_residual_pass.py) and no
    # activation times a value (fuse_act_mul: test_act_mul_pass.py)
    fusions = [p for p in DEFAULT_PASSES if p.startswith("fuse_") and p not in ("fuse_group_norm_silu",
               "fuse_linear_residual", "fuse_act_mul")]  # fmt: skip
    assert [d.pass_name for d in decisions] == [p for p in fusions for _ in range(2)]
    assert all(d.verdict == APPLIED for d in decisions)
    assert {p.name for p in out.params} == {p.name for p in program.params}
    assert out.outputs == program.outputs and out.inputs == program.inputs
    assert_bit_identical(program, out)


FUSIONS = (
    "fuse_norm_rope, fuse_norm_modulate, fuse_gated_residual, fuse_act_mul, fuse_group_norm_silu, "
    "fuse_linear_residual, reuse_attention_stats"
)


def test_summary_lists_the_pipeline_verdicts_and_places() -> None:
    program = mini_dit()
    _, decisions = optimize(program, target=NONE)
    lines = summarize(decisions, DEFAULT_PASSES, source="test")
    assert lines[0].what == f"passes: rope_before_concat, {FUSIONS}" and lines[0].why == "test"
    assert lines[1].what == "rope_before_concat: no candidates"
    assert lines[2].what.startswith("fuse_norm_rope: skipped 2 at %")
    assert lines[2].why == "target 'bare' does not declare op:rms_norm_rope"
    _, none = optimize(program, target=ALL, passes=[])
    assert none == [] and summarize([], ["fuse_norm_rope"])[1].what == "fuse_norm_rope: no candidates"


def test_dif_passes_selects_disables_and_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    with isolated_plugins(""):
        monkeypatch.delenv("DIF_PASSES", raising=False)
        assert selected_passes() == DEFAULT_PASSES
        for off in ("none", ""):
            monkeypatch.setenv("DIF_PASSES", off)
            assert selected_passes() == ()
        monkeypatch.setenv("DIF_PASSES", "fuse_gated_residual, fuse_norm_rope")
        assert selected_passes() == ("fuse_gated_residual", "fuse_norm_rope")
        monkeypatch.setenv("DIF_PASSES", "fuse_gated_residual,default")
        expanded = ("fuse_gated_residual", "rope_before_concat", "fuse_norm_rope", "fuse_norm_modulate", "fuse_act_mul",
                    "fuse_group_norm_silu", "fuse_linear_residual", "reuse_attention_stats")  # fmt: skip
        assert selected_passes() == expanded
        for bad in ("fuse_everything", "none,fuse_norm_rope"):
            monkeypatch.setenv("DIF_PASSES", bad)
            with pytest.raises(UsageError, match="DIF_PASSES"):
                selected_passes()
        with pytest.raises(UsageError, match="unknown optimizer pass"):
            optimize(mini_dit(), target=ALL, passes=["fuse_everything"])


def test_plugin_passes_run_after_the_core_ones_and_failures_are_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def count_nodes(program: Program, *, ctx) -> Program:  # type: ignore[no-untyped-def]
        seen.append(ctx.target)
        ctx.skipped(f"looked at {len(program.nodes)} nodes")
        return program

    def drop_outputs(program: Program) -> Program:  # returns a program that does not verify
        return Program(program.name, program.inputs, program.params, program.nodes, ("nope",))

    def explode(program: Program, **options: object) -> Program:
        raise RuntimeError("boom")

    class Passes:
        @dif.hookimpl
        def register_passes(self, register):  # type: ignore[no-untyped-def]
            register("count_nodes", count_nodes)
            register("drop_outputs", drop_outputs)
            register("explode", explode)
            register("fuse_norm_rope", explode)  # a core name: the core pass wins

    monkeypatch.delenv("DIF_PASSES", raising=False)
    with isolated_plugins(""):
        register_plugin(Passes(), "passes-plugin")
        pipeline = selected_passes()
        assert pipeline == (*DEFAULT_PASSES, "count_nodes", "drop_outputs", "explode")
        program = mini_dit()
        out, decisions = optimize(program, target=ALL, passes=pipeline)
    assert seen == [ALL]
    assert out.op_histogram()["gated_residual"] == 2  # core passes ran, the broken ones changed nothing
    verify_program(out)
    tail = [(d.pass_name, d.verdict) for d in decisions[6:]]
    assert tail == [("count_nodes", SKIPPED), ("drop_outputs", SKIPPED), ("explode", SKIPPED)]
    assert "does not verify" in decisions[7].reason or "VerifyError" in decisions[7].reason
    assert decisions[8].reason.endswith("RuntimeError: boom")


class _RecordingBackend:
    """Just enough of a Backend for `dif.runtime.prepare`: it keeps what it was asked to prepare."""

    name = "rec"

    def __init__(self) -> None:
        self.prepared: list[tuple[Program, object]] = []

    def profile(self) -> TargetProfile:
        return TargetProfile(backend="rec", device="unit", memory_bytes=1 << 30, capabilities=("op:*", "alias:reshape"))

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(free_memory_bytes=1 << 30)

    def prepare(self, program: Program, plan: object, weights: object) -> object:
        self.prepared.append((program, plan))
        return object()


def test_runtime_prepare_optimizes_plans_and_records(monkeypatch: pytest.MonkeyPatch) -> None:
    program = mini_dit()
    _, weights = random_bindings(program)
    backend = _RecordingBackend()
    monkeypatch.delenv("DIF_PASSES", raising=False)
    with isolated_plugins(""):
        _, plan = prepare(program, weights, backend)
        monkeypatch.setenv("DIF_PASSES", "none")
        _, plain = prepare(program, weights, backend)
        _, chosen = prepare(program, weights, backend, passes=["fuse_gated_residual"])
    (fused, _), (untouched, _), (residual, _) = backend.prepared
    assert len(fused.nodes) == len(program.nodes) - 6 and untouched is program
    assert residual.op_histogram()["gated_residual"] == 2 and "norm_modulate" not in residual.op_histogram()
    at = {op: ", ".join(n.results[0].name for n in program.nodes if n.op == op) for op in ("rope", "modulate", "add")}
    assert [d.what for d in plan.decisions][:5] == [
        f"passes: rope_before_concat, {FUSIONS}",
        "rope_before_concat: no candidates",
        f"fuse_norm_rope: applied 2 at {at['rope']}",
        f"fuse_norm_modulate: applied 2 at {at['modulate']}",
        f"fuse_gated_residual: applied 2 at {at['add']}",
    ]
    assert plan.program_fingerprint != plain.program_fingerprint and len(plan.schedule) == len(fused.nodes)
    assert plain.decisions[0].what == "passes: none" and "DIF_PASSES='none'" in plain.decisions[0].why
    assert chosen.decisions[0].why == "requested by the caller"
    assert any(d.what.startswith("views: 4 reshape placed inside") for d in plan.decisions)


# -- rope_before_concat --------------------------------------------------------------------------


def joint_rope(dtype: str = "f32", *, axis: int = 1, extra_user: bool = False, norm_text: bool = True) -> Program:
    """Text and image queries normed apart, concatenated on the token axis, rotated together (twice: q, k)."""
    b = ProgramBuilder("joint")
    cos, sin = b.input("cos", (10, 16), "f32"), b.input("sin", (10, 16), "f32")
    outs = []
    for name in ("q", "k"):
        txt, img = b.input(f"{name}_txt", (1, 4, 2, 16), dtype), b.input(f"{name}_img", (1, 6, 2, 16), dtype)
        w = b.param(f"norm_{name}.weight", (16,), dtype)
        parts = [b.emit("rms_norm", txt, w, eps=1e-6) if norm_text else txt, b.emit("rms_norm", img, w, eps=1e-6)]
        cat = b.emit("concat", *parts, axis=axis)
        outs.append(b.emit("rope", cat, cos, sin, mode="pairs") if axis == 1 else cat)
        if extra_user:
            outs.append(b.emit("neg", cat))
    b.output(*outs)
    return b.build()


def test_rope_before_concat_lets_every_part_fuse_exactly() -> None:
    from dif.passes.distribute import rope_before_concat

    program = joint_rope("bf16")
    moved, decisions = fuse_with(rope_before_concat, program)
    assert [d.verdict for d in decisions] == ["applied", "applied"]
    hist = moved.op_histogram()
    assert hist["rope"] == 4 and hist["concat"] == 2 and hist["slice"] == 4  # cos/sin rows shared by q and k
    assert_bit_identical(program, moved)
    fused, _ = optimize(program, target=ALL)
    assert fused.op_histogram().get("rope", 0) == 0 and fused.op_histogram()["rms_norm_rope"] == 4
    assert_bit_identical(program, fused)
    rope = next(n for n in moved.nodes if n.op == "rope")
    assert moved.provenance[rope.id].transforms[-1] == "rope_before_concat"


def test_rope_before_concat_skips_what_would_not_fuse() -> None:
    from dif.passes.distribute import rope_before_concat

    for program, reason in (
        (joint_rope(extra_user=True), "has 2 users"),
        (joint_rope(norm_text=True, extra_user=False), "does not declare op:rms_norm_rope"),
    ):
        target = ALL if "users" in reason else NONE
        out, decisions = fuse_with(rope_before_concat, program, target)
        assert out is program and decisions and all(reason in d.reason for d in decisions), decisions
    b = ProgramBuilder("plain")
    x = b.input("x", (1, 4, 2, 16), "f32")
    cos, sin = b.input("cos", (8, 16), "f32"), b.input("sin", (8, 16), "f32")
    b.output(b.emit("rope", b.emit("concat", x, b.emit("neg", x), axis=1), cos, sin, mode="pairs"))
    out, decisions = fuse_with(rope_before_concat, b.build())
    assert [d.reason for d in decisions] == ["no part is a weighted rms_norm used only here: nothing would fuse"]
