"""Rewriting helpers for optimizer passes (`dif.passes`): replace a short chain of nodes by one node.

A `Fusion` names the consumer node (the last node of the chain: the fused node takes its place in
the program order and its results, so no later operand changes) and the producer nodes it absorbs
(which must have no other users). `apply_fusions` builds the new program: ids renumbered 0..n-1,
provenance of every fused node merged from the chain with the pass name appended to `transforms`.
Third-party passes may use these too.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from attrs import evolve, field, frozen

from dif._convert import strs
from dif.errors import DifError
from dif.ir.program import Node, Program, Provenance
from dif.ir.types import TensorType
from dif.ops.registry import OPS, OpTable


def _nodes(items: Iterable[Node]) -> tuple[Node, ...]:
    return tuple(items)


@frozen
class Fusion:
    """Replace `consumer` and the `absorbed` producers by one `op` node with `operands` and `attrs`."""

    consumer: Node
    absorbed: tuple[Node, ...] = field(converter=_nodes)
    op: str
    operands: tuple[str, ...] = field(converter=strs)
    attrs: dict[str, Any] = field(factory=dict)


def sole_use(program: Program, value: str, consumer: Node) -> str | None:
    """None when `value` is used exactly once, by `consumer`, and is not a program output; else why not."""
    if value in program.outputs:
        return f"{value} is a program output"
    users = program.users.get(value, ())
    if len(users) != 1 or users[0].id != consumer.id:
        return f"{value} has {len(users)} users"
    if consumer.operands.count(value) != 1:
        return f"{value} appears {consumer.operands.count(value)} times in node {consumer.id}"
    return None


def fused_type_problem(program: Program, fusion: Fusion, table: OpTable = OPS) -> str | None:
    """None when the fused node's type rule gives exactly the consumer's result types; else why not."""
    opdef = table.get(fusion.op)
    types = program.types
    try:
        got = opdef.infer_types([types[o] for o in fusion.operands], fusion.attrs)
    except DifError as exc:
        return f"{fusion.op} does not type-check here: {exc}"
    want: tuple[TensorType, ...] = tuple(r.type for r in fusion.consumer.results)
    if got != want:
        return f"{fusion.op} would give {', '.join(map(str, got))}, not {', '.join(map(str, want))}"
    return None


def merge_provenance(chain: Sequence[Provenance | None], pass_name: str) -> Provenance:
    """One provenance for a fused node: location from the consumer (the last entry) where it has one,
    checkpoint tensors and earlier transforms of every node in the chain, then `pass_name`."""
    present = [p for p in chain if p is not None]
    base = present[-1] if present else Provenance()

    def first(attr: str) -> str:
        for p in reversed(present):
            if getattr(p, attr):
                return str(getattr(p, attr))
        return ""

    tensors = tuple(dict.fromkeys(t for p in present for t in p.tensors))
    transforms = tuple(dict.fromkeys(t for p in present for t in p.transforms))
    return evolve(
        base,
        module=first("module"),
        block=first("block"),
        section=first("section"),
        frontend_revision=first("frontend_revision"),
        tensors=tensors,
        transforms=(*transforms, pass_name),
    )


def apply_fusions(program: Program, fusions: Iterable[Fusion], pass_name: str, table: OpTable = OPS) -> Program:
    """The program with every fusion applied (the same object when there is none). Fusions must not
    share nodes; attributes are completed with the op's defaults so the result verifies."""
    by_consumer: dict[int, Fusion] = {}
    absorbed: set[int] = set()
    touched: set[int] = set()
    for f in fusions:
        ids = {f.consumer.id, *(n.id for n in f.absorbed)}
        if ids & touched:
            raise DifError(f"{pass_name}: fusions overlap at node {min(ids & touched)}")
        touched |= ids
        by_consumer[f.consumer.id] = f
        absorbed.update(n.id for n in f.absorbed)
    if not by_consumer:
        return program
    nodes: list[Node] = []
    provenance: dict[int, Provenance] = {}
    for node in program.nodes:
        if node.id in absorbed:
            continue
        new_id = len(nodes)
        fusion = by_consumer.get(node.id)
        if fusion is None:
            nodes.append(node if node.id == new_id else evolve(node, id=new_id))
            if node.id in program.provenance:
                provenance[new_id] = program.provenance[node.id]
            continue
        attrs = table.get(fusion.op).check_attrs(fusion.attrs)
        nodes.append(Node(new_id, fusion.op, fusion.operands, node.results, attrs))
        chain = [program.provenance.get(n.id) for n in (*fusion.absorbed, node)]
        provenance[new_id] = merge_provenance(chain, pass_name)
    return Program(program.name, program.inputs, program.params, nodes, program.outputs, provenance, dict(program.meta))


def producer_of(program: Program, value: str, ops: Collection[str]) -> Node | None:
    """The node producing `value` when its op is one of `ops`, else None (inputs, params, other ops)."""
    node = program.producers.get(value)
    return node if node is not None and node.op in ops else None
