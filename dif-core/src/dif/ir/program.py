"""The DiffIR program: typed inputs and parameters, nodes in topological order, outputs.

Everything here is frozen; passes build new programs. Value names are SSA: each is defined once
(as an input, a parameter or a node result). Provenance is kept beside the graph, keyed by node
id, and never takes part in the structural fingerprint.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any

from attrs import field, frozen

from dif._convert import strs
from dif.ir.types import TensorType

AttrValue = int | float | str | bool | None | tuple[Any, ...]


def _freeze_attr(value: Any) -> AttrValue:
    if isinstance(value, list | tuple):
        return tuple(_freeze_attr(v) for v in value)
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        return value.item()  # type: ignore[no-any-return]
    return value  # type: ignore[no-any-return]


def freeze_attrs(attrs: Mapping[str, Any]) -> dict[str, AttrValue]:
    """Attributes in canonical form: sorted keys, tuples instead of lists, Python scalars."""
    return {k: _freeze_attr(attrs[k]) for k in sorted(attrs)}


@frozen
class Value:
    name: str
    type: TensorType


@frozen
class Provenance:
    """Where a node came from: recorded by the frontend while building, appended to by passes."""

    module: str = ""
    block: str = ""
    section: str = ""
    frontend_revision: str = ""
    tensors: tuple[str, ...] = field(default=(), converter=strs)
    transforms: tuple[str, ...] = field(default=(), converter=strs)

    def describe(self) -> str:
        parts = [p for p in (self.module, self.block, self.section) if p]
        text = "/".join(parts) or "<no provenance>"
        if self.tensors:
            text += f" (tensors: {', '.join(self.tensors)})"
        if self.transforms:
            text += f" [after {', '.join(self.transforms)}]"
        return text


def _values(items: Iterable[Value]) -> tuple[Value, ...]:
    return tuple(items)


@frozen(eq=True, hash=False)
class Node:
    id: int
    op: str
    operands: tuple[str, ...] = field(converter=strs)
    results: tuple[Value, ...] = field(converter=_values)
    attrs: dict[str, AttrValue] = field(factory=dict, converter=freeze_attrs)

    @property
    def result(self) -> Value:
        """The single result of a one-result node."""
        assert len(self.results) == 1, f"node {self.id} ({self.op}) has {len(self.results)} results"
        return self.results[0]


def _nodes(items: Iterable[Node]) -> tuple[Node, ...]:
    return tuple(items)


@frozen(eq=True, hash=False)
class Program:
    name: str
    inputs: tuple[Value, ...] = field(converter=_values)
    params: tuple[Value, ...] = field(converter=_values)
    nodes: tuple[Node, ...] = field(converter=_nodes)
    outputs: tuple[str, ...] = field(converter=strs)
    provenance: dict[int, Provenance] = field(factory=dict, eq=False)
    meta: dict[str, str] = field(factory=dict, eq=False)

    @cached_property
    def types(self) -> dict[str, TensorType]:
        """Type of every value name defined in the program."""
        out = {v.name: v.type for v in (*self.inputs, *self.params)}
        for node in self.nodes:
            out.update((r.name, r.type) for r in node.results)
        return out

    @cached_property
    def producers(self) -> dict[str, Node]:
        return {r.name: n for n in self.nodes for r in n.results}

    @cached_property
    def users(self) -> dict[str, tuple[Node, ...]]:
        acc: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.operands):
                acc.setdefault(name, []).append(node)
        return {k: tuple(v) for k, v in acc.items()}

    @cached_property
    def node_by_id(self) -> dict[int, Node]:
        return {n.id: n for n in self.nodes}

    @property
    def output_values(self) -> tuple[Value, ...]:
        return tuple(Value(name, self.types[name]) for name in self.outputs)

    def param_bytes(self) -> int:
        return sum(p.type.nbytes for p in self.params)

    def param_count(self) -> int:
        return sum(p.type.numel for p in self.params)

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for node in self.nodes:
            hist[node.op] = hist.get(node.op, 0) + 1
        return dict(sorted(hist.items()))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)
