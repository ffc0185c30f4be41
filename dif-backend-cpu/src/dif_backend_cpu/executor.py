"""The CPU executor: one generic loop over a plan's schedule, reading operands and writing results
as typed views into one byte arena at the planned offsets (the last stage of the pipeline).

Because every intermediate lives where the plan put it, a wrong arena assignment corrupts the
results here, which is how the CPU backend tests plans as well as ops. Kernels are the op table's
numpy references; an op the table lacks is `NotImplementedOnBackend`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from attrs import define

from dif.dtypes import dtype_of
from dif.errors import DifError, NotImplementedOnBackend, PlanBindingError, WeightError
from dif.fingerprint import fingerprint
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.ops.registry import OpTable
from dif.plan.plan import Plan, check_plan

Kernel = Callable[[list[np.ndarray], Mapping[str, Any]], tuple[np.ndarray, ...]]


def lower_node(node: Node, table: OpTable, backend: str) -> Kernel:
    """The kernel for one node: the op table's reference (compute precision fp32, or fp64)."""
    if node.op not in table:
        raise NotImplementedOnBackend(node.op, backend, f"node {node.id}: op is not in the op table")
    return table.get(node.op).run_reference


def _describe(arr: Any) -> str:
    shape, dtype = getattr(arr, "shape", None), getattr(arr, "dtype", None)
    if shape is None or dtype is None:
        return type(arr).__name__
    try:
        name = dtype_of(arr).value
    except DifError:
        name = str(dtype)
    return f"{name}{list(shape)}"


def _matches(arr: Any, t: TensorType) -> bool:
    try:
        return tuple(arr.shape) == t.shape and dtype_of(arr) == t.dtype
    except (DifError, AttributeError, TypeError):
        return False


def bind_weights(program: Program, weights: Mapping[str, Any], backend: str) -> dict[str, np.ndarray]:
    """Every parameter by name, checked for shape and dtype (extra tensors are ignored)."""
    bound: dict[str, np.ndarray] = {}
    for p in program.params:
        if p.name not in weights:
            raise WeightError(
                f"backend '{backend}': parameter '{p.name}' ({p.type}) is missing from the weights",
                hint="check the frontend's weight-name mapping for this checkpoint",
            )
        arr = weights[p.name]
        if not _matches(arr, p.type):
            raise WeightError(f"backend '{backend}': parameter '{p.name}' expected {p.type}, got {_describe(arr)}")
        bound[p.name] = _read_only(np.asarray(arr))
    return bound


def _read_only(arr: np.ndarray) -> np.ndarray:
    # A reference that writes to its operand would corrupt another live value: make that an error.
    view = arr.view()
    view.flags.writeable = False
    return view


@define
class ArenaExecutable:
    """A program prepared on the CPU. `run` is not reentrant: the arena is reused by every call."""

    program: Program
    plan: Plan
    weights: dict[str, np.ndarray]
    kernels: dict[int, Kernel]
    arena: np.ndarray
    views: dict[str, np.ndarray]
    backend: str = "cpu"

    @classmethod
    def create(
        cls,
        program: Program,
        plan: Plan,
        weights: Mapping[str, Any],
        *,
        table: OpTable,
        backend: str = "cpu",
        check: bool = True,
    ) -> ArenaExecutable:
        """Bind and allocate. `check=False` skips the plan checks (tests use it to show that a
        corrupt plan corrupts results); never pass it outside tests."""
        if check:
            got = fingerprint(program)
            if got != plan.program_fingerprint:
                raise PlanBindingError(
                    f"backend '{backend}': plan was made for program {plan.program_fingerprint}, "
                    f"not '{program.name}' ({got})",
                    hint="re-plan this program",
                )
            check_plan(plan, program)
        kernels = {n.id: lower_node(n, table, backend) for n in program.nodes}
        bound = bind_weights(program, weights, backend)
        arena = np.zeros(plan.arena_bytes, dtype=np.uint8)
        views = {name: _view(arena, plan, value) for name, value in _results(program).items()}
        return cls(program, plan, bound, kernels, arena, views, backend)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute the schedule once; returns fresh host copies of the outputs by name."""
        env: dict[str, np.ndarray] = dict(self.weights)
        for v in self.program.inputs:
            if v.name not in inputs:
                raise DifError(f"backend '{self.backend}': input '{v.name}' ({v.type}) was not provided")
            if not _matches(inputs[v.name], v.type):
                got = _describe(inputs[v.name])
                raise DifError(f"backend '{self.backend}': input '{v.name}' expected {v.type}, got {got}")
            env[v.name] = _read_only(np.asarray(inputs[v.name]))
        nodes = self.program.node_by_id
        for node_id in self.plan.schedule:
            node = nodes[node_id]
            operands = [env[o] if o in env else _read_only(self.views[o]) for o in node.operands]
            outs = self.kernels[node_id](operands, node.attrs)
            if len(outs) != len(node.results):
                raise DifError(f"node {node_id} ({node.op}) produced {len(outs)} results, expected {len(node.results)}")
            for value, out in zip(node.results, outs, strict=True):
                stored = np.asarray(out).astype(value.type.dtype.np, copy=False).reshape(value.type.shape)
                np.copyto(self.views[value.name], stored, casting="no")
        return {
            name: np.array(env[name] if name in env else self.views[name], copy=True) for name in self.program.outputs
        }


def _results(program: Program) -> dict[str, Value]:
    return {r.name: r for n in program.nodes for r in n.results}


def _view(arena: np.ndarray, plan: Plan, value: Value) -> np.ndarray:
    """The value's slot in the arena as an array of its dtype and shape."""
    buf = plan.buffer_by_name.get(value.name)
    if buf is None:
        raise DifError(f"plan has no buffer for value '{value.name}' ({value.type})", hint="re-plan this program")
    nbytes = value.type.nbytes
    if buf.offset + nbytes > arena.size:
        raise DifError(f"buffer '{value.name}' [{buf.offset}, {buf.offset + nbytes}) runs past the arena")
    raw = arena[buf.offset : buf.offset + nbytes]
    return raw.view(value.type.dtype.np).reshape(value.type.shape)
