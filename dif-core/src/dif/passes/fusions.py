"""The core fusion passes (optimizer stage, after verify, before the planner): each finds a producer
whose only user is a given consumer and replaces the pair by one op of `dif.ops.fused`.

Every candidate (a producer of the right op feeding the consumer) gets a decision: applied, or
skipped because the producer has other users or is an output, has parameters the fused op does
not take, the fused op would not type-check, or the target does not declare `op:<fused op>`.
The fused node takes the consumer's place and result, so no other node changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dif.ir.program import Node, Program
from dif.ops.fused import ACT_MUL_ACTS
from dif.passes.context import PassContext
from dif.passes.rewrite import Fusion, apply_fusions, fused_type_problem, producer_of, sole_use


def _consider(program: Program, ctx: PassContext, fusion: Fusion, problem: str | None = None) -> str | None:
    """The reason `fusion` cannot be applied (structure, types, then target), or None."""
    if problem is None:
        for producer in fusion.absorbed:
            problem = sole_use(program, producer.results[0].name, fusion.consumer)
            if problem is not None:
                break
    if problem is None:
        problem = fused_type_problem(program, fusion)
    if problem is None and not ctx.supports(fusion.op):
        problem = ctx.lacks(fusion.op)
    return problem


def _decide(program: Program, ctx: PassContext, fusion: Fusion, problem: str | None, what: str) -> bool:
    nodes = (*(n.id for n in fusion.absorbed), fusion.consumer.id)
    value = fusion.consumer.results[0].name
    reason = _consider(program, ctx, fusion, problem)
    if reason is not None:
        ctx.skipped(reason, nodes, value)
        return False
    ctx.applied(what, nodes, value)
    return True


def fuse_norm_modulate(program: Program, *, ctx: PassContext) -> Program:
    """layer_norm(x) or rms_norm(x) without affine parameters, whose only user is
    modulate(·, scale, shift) -> norm_modulate(x, scale, shift; kind="layer"|"rms", eps); an rms_norm(x, w) with a
    weight in torch.nn.RMSNorm's order (`round_before_weight` off) -> rms_norm_modulate(x, w, scale, shift; eps,
    offset)."""
    fusions: list[Fusion] = []
    for node in program.nodes:
        if node.op != "modulate":
            continue
        norm = producer_of(program, node.operands[0], ("layer_norm", "rms_norm"))
        if norm is None:
            continue
        x, scale, shift = norm.operands[0], node.operands[1], node.operands[2]
        problem = None
        if norm.op == "rms_norm" and len(norm.operands) == 2:
            attrs = {"eps": norm.attrs["eps"], "offset": norm.attrs["offset"]}
            fusion = Fusion(node, (norm,), "rms_norm_modulate", (x, norm.operands[1], scale, shift), attrs)
            if norm.attrs["round_before_weight"]:
                problem = "rms_norm rounds before its weight (rms_norm_modulate weights the unrounded value)"
        else:
            kind = "layer" if norm.op == "layer_norm" else "rms"
            fusion = Fusion(node, (norm,), "norm_modulate", (x, scale, shift), {"kind": kind, "eps": norm.attrs["eps"]})
            problem = f"{norm.op} has affine parameters" if len(norm.operands) > 1 else None
        if _decide(program, ctx, fusion, problem, f"{norm.op} + modulate -> {fusion.op}"):
            fusions.append(fusion)
    return apply_fusions(program, fusions, ctx.pass_name)


def _fuse_either_operand(
    program: Program,
    ctx: PassContext,
    consumer: str,
    producers: tuple[str, ...],
    fused: str,
    make: Callable[[Node, str], tuple[tuple[str, ...], dict[str, Any]]],
) -> Program:
    """Every `consumer`(a, b) with an operand made by one of `producers` P (its only user the consumer; the second
    operand tried first) -> `fused`(*operands; attrs) = make(P's node, the other operand); decisions recorded per
    consumer (the first reason when neither side fits)."""
    fusions: list[Fusion] = []
    for node in program.nodes:
        if node.op != consumer:
            continue
        first: tuple[Fusion, str] | None = None
        for i in (1, 0):  # the builders write r + P(..): try the second operand first
            made = producer_of(program, node.operands[i], producers)
            if made is None:
                continue
            fusion = Fusion(node, (made,), fused, *make(made, node.operands[1 - i]))
            reason = _consider(program, ctx, fusion)
            if reason is None:
                ctx.applied(f"{consumer} + {made.op} -> {fused}", (made.id, node.id), node.results[0].name)
                fusions.append(fusion)
                first = None
                break
            first = first or (fusion, reason)
        if first is not None:
            fusion, reason = first
            ctx.skipped(reason, (fusion.absorbed[0].id, node.id), node.results[0].name)
    return apply_fusions(program, fusions, ctx.pass_name)


def fuse_gated_residual(program: Program, *, ctx: PassContext) -> Program:
    """add(x, mul(gate, y)) (either operand order) where the mul's only user is the add
    -> gated_residual(x, gate, y) = x + gate * y, same broadcasting, float dtypes only."""
    return _fuse_either_operand(
        program, ctx, "add", ("mul",), "gated_residual", lambda mul, x: ((x, *mul.operands), {})
    )


def fuse_linear_residual(program: Program, *, ctx: PassContext) -> Program:
    """add(r, linear(x, w, bias?)) (either operand order) where the linear's only user is the add and r
    has exactly the linear's shape and dtype -> linear_add(x, w, r, bias?) = x @ w^T + bias + r: the
    residual add of a transformer layer goes into the GEMM's epilogue (cuBLASLt's C with beta = 1)."""
    return _fuse_either_operand(
        program, ctx, "add", ("linear",), "linear_add", lambda lin, r: ((*lin.operands[:2], r, *lin.operands[2:]), {})
    )


def fuse_norm_rope(program: Program, *, ctx: PassContext) -> Program:
    """rms_norm(x, w) whose only user is rope(·, cos, sin)
    -> rms_norm_rope(x, w, cos, sin; eps, offset, round_before_weight, mode) (per-head q/k norm + RoPE)."""
    fusions: list[Fusion] = []
    for node in program.nodes:
        if node.op != "rope":
            continue
        norm = producer_of(program, node.operands[0], ("rms_norm",))
        if norm is None:
            continue
        attrs = {k: norm.attrs[k] for k in ("eps", "offset", "round_before_weight")} | {"mode": node.attrs["mode"]}
        fusion = Fusion(node, (norm,), "rms_norm_rope", (*norm.operands, *node.operands[1:]), attrs)
        unweighted = "rms_norm has no weight" if len(norm.operands) < 2 else None
        if _decide(program, ctx, fusion, unweighted, "rms_norm + rope -> rms_norm_rope"):
            fusions.append(fusion)
    return apply_fusions(program, fusions, ctx.pass_name)


def fuse_act_mul(program: Program, *, ctx: PassContext) -> Program:
    """mul(act(g), u) or mul(u, act(g)), act a silu or sigmoid whose only user is the mul, g and u of the mul's
    type (no broadcast: the fused type rule) -> act_mul(g, u; act): Krea 2's SwiGLU from two GEMMs and its
    sigmoid-gated attention output, one pass over the two operands where the pair took two."""
    return _fuse_either_operand(
        program, ctx, "mul", ACT_MUL_ACTS, "act_mul", lambda act, u: ((act.operands[0], u), {"act": act.op})
    )
