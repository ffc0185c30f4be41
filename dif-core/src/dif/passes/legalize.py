"""Legalization: a node of a fused op the target does not run becomes the chain of core ops it stands for.

Some fused ops are emitted by a transform rather than by an optimizer pass: autodiff emits `sdpa_backward`
(flash-attention backward) because no pass could recover it from the chain afterwards. Such an op registers
its decomposition here (`decomposition`); `legalize` replaces every node of it that the target does not
declare (`op:<name>`) by the decomposition's nodes, before the optimizer runs, so every backend runs every
program that autodiff makes. Value names outside the replaced nodes, the program's outputs among them, do
not change; the new nodes' provenance is the replaced node's with `legalize` appended.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from attrs import evolve

from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Node, Program, Provenance, Value
from dif.passes.context import supports_op
from dif.plan.plan import Decision
from dif.target import TargetProfile

TRANSFORM = "legalize"

Decomposition = Callable[..., Sequence[Var]]
"""`fn(b, *operands, **attrs)`: emits the op's meaning from core ops; returns one value per result."""

_DECOMPOSITIONS: dict[str, Decomposition] = {}


def decomposition(op: str) -> Callable[[Decomposition], Decomposition]:
    """Decorator: register the decorated function as `op`'s decomposition."""

    def wrap(fn: Decomposition) -> Decomposition:
        if _DECOMPOSITIONS.get(op, fn) is not fn:
            raise DifError(f"op '{op}' already has a decomposition")
        _DECOMPOSITIONS[op] = fn
        return fn

    return wrap


def _registered() -> dict[str, Decomposition]:
    # the modules that emit such ops register their decompositions
    from dif.autodiff import rules  # noqa: F401
    from dif.train import optim  # noqa: F401

    return _DECOMPOSITIONS


def decomposable() -> frozenset[str]:
    """The ops with a decomposition: a backend need not lower them (it gets their chains)."""
    return frozenset(_registered())


def legalize(program: Program, target: TargetProfile | None) -> tuple[Program, list[Decision]]:
    """`program` with every node the target cannot run replaced by its decomposition (the same object
    when there is none), and one decision per op replaced."""
    table = _registered()
    todo = [n for n in program.nodes if n.op in table and not supports_op(target, n.op)]
    if not todo:
        return program, []
    expanded = {n.id for n in todo}
    nodes: list[Node] = []
    provenance: dict[int, Provenance] = {}
    for node in program.nodes:
        prov = program.provenance.get(node.id)
        new = _expand(node, table[node.op], program) if node.id in expanded else [node]
        for n in new:
            nid = len(nodes)
            nodes.append(evolve(n, id=nid))
            if prov is not None or n is not node:
                base = prov or Provenance()
                provenance[nid] = base if n is node else evolve(base, transforms=(*base.transforms, TRANSFORM))
    out = evolve(program, nodes=tuple(nodes), provenance=provenance, meta=dict(program.meta))
    backend = target.backend if target is not None else "?"
    counts = Counter(n.op for n in todo)
    decisions = [
        Decision(
            f"legalize: {count} {op} node(s) run as their chain of core ops",
            f"target '{backend}' does not declare op:{op}",
        )
        for op, count in counts.items()
    ]
    return out, decisions


def _expand(node: Node, fn: Decomposition, program: Program) -> list[Node]:
    """The nodes of `fn` for `node`, its operands and results keeping their names; values in between are
    named after the node's first result, so they cannot meet a name of the program."""
    types = program.types
    b = ProgramBuilder(f"{node.op}.decomposition")
    operands = [b.input(f"x{i}", types[o].shape, types[o].dtype) for i, o in enumerate(node.operands)]
    results = list(fn(b, *operands, **node.attrs))
    b.output(*results)
    chain = b.build()
    if [chain.types[r] for r in chain.outputs] != [r.type for r in node.results]:
        raise DifError(f"the decomposition of '{node.op}' gives {[str(chain.types[r]) for r in chain.outputs]}, "
                       f"the node's results are {[str(r.type) for r in node.results]}")  # fmt: skip
    names = {f"x{i}": o for i, o in enumerate(node.operands)}
    names.update((r, res.name) for r, res in zip(chain.outputs, node.results, strict=True))
    stem = node.results[0].name

    def name(v: str) -> str:
        return names.setdefault(v, f"{stem}.{node.op}.{len(names)}")

    renamed = []
    for n in chain.nodes:
        operands = tuple(name(o) for o in n.operands)
        renamed.append(evolve(n, operands=operands, results=tuple(Value(name(r.name), r.type) for r in n.results)))
    return renamed
