"""A rank program cut at its collectives: the collective-free pieces a backend prepares, and the
collective nodes the runner performs between them.

    rank program --cut--> [Segment, Collective, Collective, Segment, ...]

A segment's inputs are the program inputs and earlier results it reads (results renamed "in%N": program
inputs may not start with '%'), its params the weights it reads, its outputs what later steps read.
"""

from __future__ import annotations

from attrs import frozen

from dif.ir.program import Node, Program, Value
from dif.parallel.collectives import COLLECTIVES


@frozen
class Segment:
    program: Program
    feeds: dict[str, str]  # segment input name -> the rank program's value name


@frozen
class Collective:
    node: Node

    @property
    def axes(self) -> tuple[int, int]:
        """(split_axis, concat_axis) of the all_to_all."""
        split, concat = self.node.attrs["split_axis"], self.node.attrs["concat_axis"]
        assert isinstance(split, int) and isinstance(concat, int)
        return split, concat


Step = Segment | Collective


def boundary_name(name: str) -> str:
    return f"in{name}" if name.startswith("%") else name


def cut(program: Program) -> list[Step]:
    """`program`'s steps in order (empty segments left out)."""
    groups: list[list[Node] | Node] = [[]]
    for node in program.nodes:
        if node.op in COLLECTIVES:
            groups += [node, []]
        else:
            last = groups[-1]
            assert isinstance(last, list)
            last.append(node)
    later_use: dict[str, int] = {}  # value -> the last group index reading it
    for gi, group in enumerate(groups):
        for node in group if isinstance(group, list) else [group]:
            for o in node.operands:
                later_use[o] = gi
    for o in program.outputs:
        later_use[o] = len(groups)
    types, params = program.types, {p.name: p for p in program.params}
    steps: list[Step] = []
    for gi, group in enumerate(groups):
        if isinstance(group, Node):
            steps.append(Collective(group))
        elif group:
            steps.append(_segment(program, group, gi, later_use, types, params))
    return steps


def _segment(program: Program, nodes: list[Node], gi: int, later_use: dict[str, int], types, params) -> Segment:  # type: ignore[no-untyped-def]
    defined = {r.name for n in nodes for r in n.results}
    reads = list(dict.fromkeys(o for n in nodes for o in n.operands if o not in defined))
    inputs = [Value(boundary_name(o), types[o]) for o in reads if o not in params]
    used_params = [params[o] for o in reads if o in params]
    rename = {o: boundary_name(o) for o in reads if o not in params}
    renumbered = []
    for i, n in enumerate(nodes):
        renumbered.append(Node(i, n.op, tuple(rename.get(o, o) for o in n.operands), n.results, n.attrs))
    outputs = [r.name for n in nodes for r in n.results if later_use.get(r.name, -1) > gi]
    provenance = {i: program.provenance[n.id] for i, n in enumerate(nodes) if n.id in program.provenance}
    seg = Program(f"{program.name}.seg{gi}", inputs, used_params, renumbered, outputs, provenance, dict(program.meta))
    return Segment(seg, {v: k for k, v in rename.items()})
