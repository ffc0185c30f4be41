"""`reuse_attention_stats`: in a training step, the forward attention hands its softmax statistics to its
backward.

Autodiff differentiates unmasked half-precision attention into one `sdpa_backward` node, which on its own
must recompute the forward's per-row log-sum-exp (a second forward pass over the scores). Where the same
step holds the forward `sdpa` of the same q, k, v and scale, this pass turns it into `sdpa_stats` (the same
output, plus the statistics, fp32 [B, H, Sq]) and gives the statistics to the backward as its `lse` operand.
Both nodes keep their places and result names; the statistics are a new value named after the output.
"""

from __future__ import annotations

import math

from attrs import evolve

from dif.ir.program import Node, Program, Provenance, Value
from dif.ir.types import TensorType
from dif.passes.context import PassContext

STATS_OP = "sdpa_stats"


def reuse_attention_stats(program: Program, *, ctx: PassContext) -> Program:
    """Each sdpa_backward(q, k, v, o, do) whose o is produced by sdpa(q, k, v) with the same scale (and no
    mask, not causal) gets that forward as sdpa_stats and its statistics as a sixth operand."""
    producers = program.producers
    replaced: dict[int, Node] = {}
    for node in program.nodes:
        if node.op != "sdpa_backward" or len(node.operands) > 5:
            continue
        forward = producers.get(node.operands[3])
        value = node.results[0].name
        nodes = (node.id,) if forward is None else (forward.id, node.id)
        why = _unmatched(forward, node, program.types[node.operands[0]].shape[3])
        if why is None and not ctx.supports(STATS_OP):
            why = ctx.lacks(STATS_OP)
        if why is not None or forward is None:
            ctx.skipped(why or "o is an input", nodes, value)
            continue
        if forward.id not in replaced:
            out = forward.results[0]
            b, sq, hq, d = program.types[forward.operands[0]].shape
            stats = Value(f"{out.name}.lse", TensorType((b, hq, sq), "f32"))
            replaced[forward.id] = evolve(forward, op=STATS_OP, operands=forward.operands[:3],
                                          results=(out, stats), attrs={"scale": _scale(forward, d)})  # fmt: skip
        lse = replaced[forward.id].results[1].name
        replaced[node.id] = evolve(node, operands=(*node.operands, lse))
        ctx.applied("the forward's softmax statistics go to the backward (sdpa -> sdpa_stats)", nodes, value)
    if not replaced:
        return program
    provenance = dict(program.provenance)
    for nid in replaced:
        base = provenance.get(nid, Provenance())
        provenance[nid] = evolve(base, transforms=(*base.transforms, ctx.pass_name))
    nodes = tuple(replaced.get(n.id, n) for n in program.nodes)
    return evolve(program, nodes=nodes, provenance=provenance, meta=dict(program.meta))


def _unmatched(forward: Node | None, backward: Node, d: int) -> str | None:
    """Why `forward` is not the attention `backward` differentiates, or None."""
    if forward is None:
        return None
    if forward.op not in ("sdpa", STATS_OP):
        return f"o comes from {forward.op}, not sdpa"
    if len(forward.operands) > 3 or forward.attrs.get("causal"):
        return "the forward attention is masked or causal"
    if tuple(forward.operands[:3]) != tuple(backward.operands[:3]):
        return "the forward attends other q, k, v (recomputed in a checkpointed block, say)"
    if _scale(forward, d) != _scale(backward, d):
        return f"scales differ ({_scale(forward, d)} and {_scale(backward, d)})"
    return None


def _scale(node: Node, d: int) -> float:
    """The softmax scale `node` applies (0 stands for 1/sqrt(head dim))."""
    return float(node.attrs["scale"]) or 1.0 / math.sqrt(d)
