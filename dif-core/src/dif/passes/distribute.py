"""`rope_before_concat` (optimizer stage, before the fusions): apply RoPE to each part of a token-axis
concat instead of to the whole, so each part's per-head RMS norm can fuse with its RoPE.

Joint-attention blocks (FLUX.2's double-stream block) norm the text and image queries separately,
concatenate them along the token axis and rotate the result:

    rope(concat(rms_norm(q_txt), rms_norm(q_img), axis=1), cos, sin)
 -> concat(rope(rms_norm(q_txt), cos[:n_txt], sin[:n_txt]), rope(rms_norm(q_img), cos[n_txt:], ...), axis=1)

RoPE rotates each token with its own table row, so this is exact. The table slices are shared by
every rewritten rope that needs the same rows. It applies only where it lets `fuse_norm_rope` fire
(a part is an rms_norm used only by this concat, and the target declares `op:rms_norm_rope`): on
its own it would only add launches.
"""

from __future__ import annotations

from attrs import evolve

from dif.ir.program import Node, Program, Provenance, Value
from dif.ir.types import TensorType
from dif.passes.context import PassContext
from dif.passes.rewrite import merge_provenance, producer_of, sole_use

SEQ_AXIS = 1  # rope's x is [B, S, H, D]; cos/sin are [S, R]


def _candidate(program: Program, rope: Node, ctx: PassContext) -> tuple[Node | None, str | None]:
    """(the concat to distribute over, None) or (None or the concat, why not)."""
    cat = producer_of(program, rope.operands[0], ("concat",))
    if cat is None:
        return None, None  # not the pattern: no decision
    rank = len(program.types[rope.operands[0]].shape)
    if cat.attrs["axis"] % rank != SEQ_AXIS:
        return cat, "the concat is not along the token axis"
    problem = sole_use(program, cat.results[0].name, rope)
    if problem is not None:
        return cat, problem
    norms = [producer_of(program, o, ("rms_norm",)) for o in cat.operands]
    if not any(n is not None and len(n.operands) == 2 and sole_use(program, o, cat) is None
               for n, o in zip(norms, cat.operands, strict=True)):  # fmt: skip
        return cat, "no part is a weighted rms_norm used only here: nothing would fuse"
    if not ctx.supports("rms_norm_rope"):
        return cat, ctx.lacks("rms_norm_rope")
    return cat, None


def rope_before_concat(program: Program, *, ctx: PassContext) -> Program:
    """See the module docstring."""
    plans: dict[int, Node] = {}  # rope id -> its concat
    for node in program.nodes:
        if node.op != "rope":
            continue
        cat, problem = _candidate(program, node, ctx)
        if cat is None and problem is None:
            continue
        nodes = (cat.id, node.id) if cat is not None else (node.id,)
        if problem is not None:
            ctx.skipped(problem, nodes, node.results[0].name)
            continue
        assert cat is not None
        ctx.applied(f"rope over {len(cat.operands)} concat parts -> concat of ropes", nodes, node.results[0].name)
        plans[node.id] = cat
    if not plans:
        return program
    return _rewrite(program, plans, ctx.pass_name)


def _rewrite(program: Program, plans: dict[int, Node], pass_name: str) -> Program:
    dropped = {cat.id for cat in plans.values()}
    types = program.types
    nodes: list[Node] = []
    provenance: dict[int, Provenance] = {}
    table_rows: dict[tuple[str, int, int], str] = {}  # (table, start, stop) -> sliced value

    def add(node: Node, prov: Provenance | None) -> None:
        nodes.append(evolve(node, id=len(nodes)))
        if prov is not None:
            provenance[len(nodes) - 1] = prov

    for node in program.nodes:
        if node.id in dropped:
            continue
        cat = plans.get(node.id)
        prov = program.provenance.get(node.id)
        if cat is None:
            add(node, prov)
            continue
        merged = merge_provenance([program.provenance.get(cat.id), prov], pass_name)
        out = node.results[0]
        parts, start = [], 0
        for k, part in enumerate(cat.operands):
            t = types[part]
            stop = start + t.shape[SEQ_AXIS]
            tables = []
            for table in node.operands[1:3]:
                key = (table, start, stop)
                if key not in table_rows:
                    rows = TensorType((stop - start, *types[table].shape[1:]), types[table].dtype)
                    table_rows[key] = f"{table}.rows{start}_{stop}"
                    value = Value(table_rows[key], rows)
                    attrs = {"axis": 0, "start": start, "stop": stop, "step": 1}
                    add(Node(0, "slice", (table,), (value,), attrs), merged)
                tables.append(table_rows[key])
            rotated = Value(f"{out.name}.part{k}", t)
            add(Node(0, "rope", (part, *tables), (rotated,), dict(node.attrs)), merged)
            parts.append(rotated.name)
            start = stop
        add(Node(0, "concat", tuple(parts), (out,), dict(cat.attrs)), merged)
    return Program(program.name, program.inputs, program.params, nodes, program.outputs, provenance, dict(program.meta))
