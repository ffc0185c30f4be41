"""The CPU executor: one generic loop over a plan's schedule, reading operands and writing results
as typed views into one byte arena at the planned offsets (the last stage of the pipeline).

Because every intermediate lives where the plan put it, a wrong arena assignment corrupts the
results here, which is how the CPU backend tests plans as well as ops. Kernels are the op table's
numpy references; an op the table lacks is `NotImplementedOnBackend`. Values the plan places as views
(`dif.plan.views`) are strided arrays over their root's bytes: a reshape or split whose results are
views is not run (they already show those bytes), a concat operand's producer writes into its part.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from attrs import define, field

from dif import trace
from dif.backend_checks import check_inputs, check_plan_binding, check_weights
from dif.errors import DeviceMemoryError, DifError, NotImplementedOnBackend
from dif.interp import cast_results
from dif.ir.program import Node, Program, Value
from dif.ops.registry import OpTable
from dif.plan.plan import Plan
from dif.plan.views import VIEW_OPS, byte_strides
from dif.trace.vocabulary import ALLOC, COPY_D2H

Kernel = Callable[[list[np.ndarray], Mapping[str, Any]], tuple[np.ndarray, ...]]


def lower_node(node: Node, table: OpTable, backend: str) -> Kernel:
    """The kernel for one node: the op table's reference (compute precision fp32, or fp64)."""
    if node.op not in table:
        raise NotImplementedOnBackend(node.op, backend, f"node {node.id}: op is not in the op table")
    return table.get(node.op).run_reference


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
    aliased: frozenset[int] = field(factory=frozenset)  # nodes whose results are views of their operand

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
            check_plan_binding(program, plan, backend)
        kernels = {n.id: lower_node(n, table, backend) for n in program.nodes}
        bound = {name: _read_only(arr) for name, arr in check_weights(program, weights, backend).items()}
        try:
            arena = np.zeros(plan.arena_bytes, dtype=np.uint8)
        except MemoryError as exc:
            raise _out_of_memory(backend, program.name, "plan arena", exc, plan.arena_bytes) from None
        views = {name: _view(arena, plan, value) for name, value in _results(program).items()}
        rec = trace.begin("prepare", program, backend)
        if rec is not None:
            rec.event(ALLOC, nbytes=plan.arena_bytes, what="plan arena")
            rec.finish()
        return cls(program, plan, bound, kernels, arena, views, backend, _aliased(program, plan))

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute the schedule once; returns fresh host copies of the outputs by name."""
        env: dict[str, np.ndarray] = dict(self.weights)
        for name, arr in check_inputs(self.program, inputs, self.backend).items():
            env[name] = _read_only(arr)
        nodes = self.program.node_by_id
        rec = trace.begin("run", self.program, self.backend, self.plan.schedule)  # None: tracing is off
        for node_id in self.plan.schedule:
            node = nodes[node_id]
            started = rec.clock() if rec is not None else 0.0
            if node_id not in self.aliased:
                operands = [env[o] if o in env else _read_only(self.views[o]) for o in node.operands]
                try:
                    outs = cast_results(node, self.kernels[node_id](operands, node.attrs))
                except MemoryError as exc:  # a kernel's own temporaries (the reference sdpa's N x N scores)
                    what = f"op '{node.op}' (node {node.id})"
                    raise _out_of_memory(self.backend, self.program.name, what, exc) from None
                for value, out in zip(node.results, outs, strict=True):
                    np.copyto(self.views[value.name], out, casting="no")
            if rec is not None:
                impl = "view" if node_id in self.aliased else "numpy reference"
                rec.op(node, started, [self.views[r.name] for r in node.results], impl=impl)
        started = rec.clock() if rec is not None else 0.0
        result = {
            name: np.array(env[name] if name in env else self.views[name], copy=True) for name in self.program.outputs
        }
        if rec is not None:
            ms = (rec.clock() - started) * 1000.0
            rec.event(COPY_D2H, ms=ms, nbytes=sum(int(a.nbytes) for a in result.values()), what="outputs")
            rec.finish()
        return result

    def release(self) -> None:
        """Nothing to free on a device: the arena and the weights are host memory, freed with the
        executable when its owner drops it (`dif.backend.Executable.release`)."""


def _out_of_memory(
    backend: str, program: str, what: str, exc: MemoryError, nbytes: int | None = None
) -> DeviceMemoryError:
    """numpy's MemoryError as dif's, with the bytes asked for (numpy's `_ArrayMemoryError` knows them)."""
    from dif.host import available_memory_bytes

    asked = int(getattr(exc, "_total_size", 0)) if nbytes is None else nbytes
    return DeviceMemoryError(backend, program, asked, what, available_memory_bytes(), str(exc))


def _aliased(program: Program, plan: Plan) -> frozenset[int]:
    """Reshape and split nodes all of whose results are views (`check_plan` checked they are in place)."""
    buffers = plan.buffer_by_name
    return frozenset(
        n.id
        for n in program.nodes
        if n.op in VIEW_OPS and n.results and all(buffers[r.name].is_alias for r in n.results)
    )


def _results(program: Program) -> dict[str, Value]:
    return {r.name: r for n in program.nodes for r in n.results}


def _view(arena: np.ndarray, plan: Plan, value: Value) -> np.ndarray:
    """The value's slot in the arena as an array of its dtype and shape."""
    buf = plan.buffer_by_name.get(value.name)
    if buf is None:
        raise DifError(f"plan has no buffer for value '{value.name}' ({value.type})", hint="re-plan this program")
    t = value.type
    if buf.offset + buf.extent > arena.size:
        raise DifError(f"buffer '{value.name}' [{buf.offset}, {buf.offset + buf.extent}) runs past the arena")
    raw = arena[buf.offset : buf.offset + buf.extent].view(t.dtype.np)
    if not buf.pitch_bytes:
        return raw.reshape(t.shape)
    strides = byte_strides(t.shape, t.dtype.itemsize, buf.row_bytes, buf.pitch_bytes)
    return np.lib.stride_tricks.as_strided(raw, t.shape, strides)
