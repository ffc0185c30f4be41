"""The contract between a GPU backend's lowering and dif (after planning, before execution): one lowering
signature and one table type for every backend, so each `lower/<group>.py` looks the same everywhere.

A lowering is `fn(ctx, node, attrs, ins, outs) -> steps`: `ctx` is the backend's `LowerCtx`, `attrs` the
node's checked attributes, `ins` / `outs` the backend's tensor handles of operands / results; it returns
the device steps (launches, copies, library calls) that compute the node, in order. What a backend can
run is the table's keys; the fused ops among them are what it declares to the optimizer (`op:<name>`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dif.errors import NotImplementedOnBackend, PluginError
from dif.ir.program import Node
from dif.ops.registry import OPS, OpTable

Lowering = Callable[[Any, Node, dict[str, Any], list[Any], list[Any]], list[Any]]
"""(ctx, node, attrs, ins, outs) -> steps."""

FUSED_CATEGORY = "fused"
"""The op-table category (`dif.ops.fused`) of the ops optimizer passes make; a backend declares the ones
it lowers so the passes (`dif.passes.context.supports_op`) make only those."""


class LoweringTable(Mapping[str, Lowering]):
    """op name -> lowering of one backend; filled by the `register` decorator as the backend's
    `lower/*.py` modules are imported (by `lower/__init__.py`, in a fixed order)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._fns: dict[str, Lowering] = {}

    def register(self, *ops: str) -> Callable[[Any], Any]:
        """Decorator: `fn` lowers every op in `ops` (an op lowered twice is a bug, refused)."""

        def wrap(fn: Any) -> Any:
            for op in ops:
                if op in self._fns:
                    raise PluginError(
                        f"{self.backend} backend: op '{op}' lowered twice ({self._fns[op].__module__} and "
                        f"{fn.__module__}); keep one lowering per op"
                    )
                self._fns[op] = fn
            return fn

        return wrap

    def lookup(self, node: Node) -> Lowering:
        """The lowering of `node.op`; `NotImplementedOnBackend` naming op, backend and node when none."""
        fn = self._fns.get(node.op)
        if fn is None:
            detail = f"node {node.id}: no {self.backend} lowering for this op"
            raise NotImplementedOnBackend(node.op, self.backend, detail)
        return fn

    @property
    def ops(self) -> frozenset[str]:
        """Every op this backend lowers (its `BackendInfo.supported_ops`)."""
        return frozenset(self._fns)

    def fused_ops(self, table: OpTable = OPS) -> tuple[str, ...]:
        """The lowered ops of the fused category, in registration order."""
        return tuple(op for op in self._fns if op in table and table.get(op).category == FUSED_CATEGORY)

    def op_capabilities(self, table: OpTable = OPS) -> list[str]:
        """`op:<name>` for every fused op lowered: what the target profile declares to the optimizer."""
        from dif.passes.context import OP_CAPABILITY

        return [OP_CAPABILITY.format(op) for op in self.fused_ops(table)]

    def __getitem__(self, op: str) -> Lowering:
        return self._fns[op]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)
