"""The norm + activation fusion pass (optimizer stage, after verify, before the planner):
group_norm(x, w, b) whose only user is silu(.) -> group_norm_silu(x, w, b) (`dif.ops.norm_act`).

Every GroupNorm of an SD UNet / VAE resnet feeds a SiLU; unfused the pair writes the normalized
activation and reads it back (the seed document's "fuse group_norm + SiLU"). Each candidate gets a
decision: applied, or skipped because the norm has other users or is an output, the fused op would not
type-check, or the target does not declare `op:group_norm_silu`. The fused node takes the SiLU's
place and result, so no other node changes.
"""

from __future__ import annotations

from dif.ir.program import Program
from dif.passes.context import PassContext
from dif.passes.rewrite import Fusion, apply_fusions, fused_type_problem, producer_of, sole_use

FUSED = "group_norm_silu"


def fuse_group_norm_silu(program: Program, *, ctx: PassContext) -> Program:
    """silu(group_norm(x, w, b; groups, eps)) -> group_norm_silu(x, w, b; groups, eps)."""
    fusions: list[Fusion] = []
    for node in program.nodes:
        if node.op != "silu":
            continue
        norm = producer_of(program, node.operands[0], ("group_norm",))
        if norm is None:
            continue
        attrs = {"groups": norm.attrs["groups"], "eps": norm.attrs["eps"]}
        fusion = Fusion(node, (norm,), FUSED, norm.operands, attrs)
        value = node.results[0].name
        problem = sole_use(program, norm.results[0].name, node) or fused_type_problem(program, fusion)
        if problem is None and not ctx.supports(FUSED):
            problem = ctx.lacks(FUSED)
        if problem is not None:
            ctx.skipped(problem, (norm.id, node.id), value)
            continue
        ctx.applied("group_norm + silu -> group_norm_silu", (norm.id, node.id), value)
        fusions.append(fusion)
    return apply_fusions(program, fusions, ctx.pass_name)
