"""The OpenCL executor: a prepared program whose `run` uploads inputs, enqueues pre-bound launches
on one in-order queue, and reads back only the outputs (the last stage of the pipeline).

The plan decides where everything is (`dif.plan`); `create` follows it and decides nothing:
- intermediates live in ONE device buffer of `plan.arena_bytes` at the planned offsets (kernels get
  base buffer + element offset, which needs no CL_DEVICE_MEM_BASE_ADDR_ALIGN sub-buffers); when
  the arena exceeds the device's largest allocation, each value gets a pool buffer instead,
  reused after its last consumer in schedule order;
- nodes the plan places on the host (`Plan.placement`) run there with the op's numpy reference:
  those reading only weights once in `create` (their results then stay on the device like weights),
  the others in every run, their results written into their arena slot before the first device
  node that reads them;
- inputs, resident weights and per-node scratch use pool buffers; streamed weights sit in one
  staging buffer laid out as the plan's streaming schedule says (`Plan.streaming`: slot and offset
  of every parameter) and are uploaded before their first device consumer in every run (the queue
  is in order, so a slot's next tenant arrives only after its previous one was last read);
- a reshape whose result the plan aliases to its operand (`Buffer.alias_of`) launches nothing: its
  result is the operand's device bytes seen with the new shape (the plan keeps them alive).
No kernel is followed by clFinish: the queue orders launches and `run` waits once, for the
output reads. Buffers go back to the pool only after the last run's final event completes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import define, field

from dif.backend_checks import check_inputs, check_plan_binding, check_weights
from dif.errors import DeviceMemoryError, DifError
from dif.interp import evaluate_node
from dif.ir.program import Node, Program
from dif.plan.placement import HOST
from dif.plan.plan import Plan
from dif_backend_opencl.lower import LowerCtx, Ref, Slot, Step, Upload, lower_node

if TYPE_CHECKING:
    from dif_backend_opencl.device import OpenCLBackend

BACKEND = "opencl"


def _bytes_of(arr: np.ndarray) -> np.ndarray:
    """A contiguous uint8 view (pyopencl cannot take ml_dtypes arrays through the buffer protocol)."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def split_by_placement(program: Program, plan: Plan) -> tuple[list[Node], list[Node], list[Node]]:
    """The plan's placement as (const nodes: on the host, reading weights and const results only, so
    evaluated once; host nodes: evaluated every run; device nodes), each in schedule order.
    `check_plan` has checked that host nodes read only inputs, weights and earlier host results."""
    nodes = program.node_by_id
    const_known = {p.name for p in program.params}
    const, host, device = [], [], []
    for node_id, where in zip(plan.schedule, plan.placement, strict=True):
        node = nodes[node_id]
        if where != HOST:
            device.append(node)
        elif all(o in const_known for o in node.operands):
            const.append(node)
            const_known.update(r.name for r in node.results)
        else:
            host.append(node)
    return const, host, device


def evaluate(node: Node, env: dict[str, np.ndarray]) -> None:
    """Run one node on the host with the op table's numpy reference (`dif.interp.evaluate_node`)."""
    outs = evaluate_node(node, [env[o] for o in node.operands])
    env.update((value.name, arr) for value, arr in zip(node.results, outs, strict=True))


@define
class OpenCLExecutable:
    """A program prepared on one OpenCL device. `run` is not reentrant (one arena)."""

    backend: OpenCLBackend
    program: Program
    plan: Plan
    steps: list[Any]
    host_nodes: list[Node]
    const_env: dict[str, np.ndarray]
    input_slots: dict[str, Slot]
    host_uploads: dict[str, np.ndarray]  # run-time host results the device reads: bytes its uploads send
    outputs: dict[str, Ref]  # device-resident outputs
    buffers: dict[Slot, Any]
    weights: dict[str, np.ndarray]
    owned: list[Any] = field(factory=list)
    mode: str = "arena"
    last_event: Any = None
    closed: bool = False

    @classmethod
    def create(
        cls, backend: OpenCLBackend, program: Program, plan: Plan, weights: Mapping[str, Any]
    ) -> OpenCLExecutable:
        check_plan_binding(program, plan, BACKEND)
        bound = check_weights(program, weights, BACKEND)
        const, host, device = split_by_placement(program, plan)
        const_env: dict[str, np.ndarray] = dict(bound)
        for node in const:
            evaluate(node, const_env)
        const_env = {k: v for k, v in const_env.items() if k not in bound}
        return _Builder(backend, program, plan, bound, const_env, host, device).build()

    # -- running ----------------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute once; returns host copies of the outputs by name."""
        return self._run(inputs, None)

    def run_profiled(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[int, float]]:
        """`run`, plus device seconds per node id (needs `OpenCLBackend(profiling=True)`)."""
        times: dict[int, float] = {}
        return self._run(inputs, times), times

    def _run(self, inputs: Mapping[str, np.ndarray], times: dict[int, float] | None) -> dict[str, np.ndarray]:
        import pyopencl as cl

        try:
            return self._enqueue_all(inputs, times)
        except cl.MemoryError as exc:  # drivers that allocate on first use fail here, not in cl.Buffer
            held = sum(int(buf.size) for buf in self.owned)
            free = self.backend.budget().free_memory_bytes
            what = "device buffers (allocated by the driver on first use)"
            raise DeviceMemoryError(BACKEND, self.program.name, held, what, free, str(exc)) from exc

    def _enqueue_all(self, inputs: Mapping[str, np.ndarray], times: dict[int, float] | None) -> dict[str, np.ndarray]:
        import pyopencl as cl

        if self.closed:
            raise DifError(f"backend '{BACKEND}': '{self.program.name}' was closed", hint="prepare it again")
        queue = self.backend.queue
        env: dict[str, np.ndarray] = dict(self.const_env)
        env.update(check_inputs(self.program, inputs, BACKEND))
        for name, slot in self.input_slots.items():
            if env[name].nbytes:
                cl.enqueue_copy(queue, self.buffers[slot], _bytes_of(env[name]), is_blocking=False)
        if self.host_nodes:
            env.update(self.weights)
            for node in self.host_nodes:
                evaluate(node, env)
            for name, staged in self.host_uploads.items():  # sent by Upload steps, before the first reader
                staged[:] = _bytes_of(env[name])
        events = []
        for step in self.steps:
            event = step.enqueue(queue)
            if times is not None:
                events.append((step.node_id, event))
        results: dict[str, np.ndarray] = {}
        for name in self.program.outputs:
            if name in env or name in self.weights:
                results[name] = np.array(env.get(name, self.weights.get(name)), copy=True)
            else:
                ref = self.outputs[name]
                raw = np.empty(ref.type.nbytes, np.uint8)
                if raw.nbytes:
                    cl.enqueue_copy(queue, raw, self.buffers[ref.slot], src_offset=ref.byte_offset, is_blocking=False)
                results[name] = raw.view(ref.dtype.np).reshape(ref.type.shape)
        self.last_event = cl.enqueue_marker(queue)
        self.last_event.wait()
        for node_id, event in events:
            assert times is not None
            times[node_id] = times.get(node_id, 0.0) + (event.profile.end - event.profile.start) * 1e-9
        return results

    @property
    def launches(self) -> int:
        """Kernel launches and device copies per run."""
        return len(self.steps)

    def close(self) -> None:
        """Give the device buffers back to the backend's pool once the last run has finished."""
        if self.last_event is not None:
            self.last_event.wait()
            self.last_event = None
        for buf in self.owned:
            self.backend.pool.release(buf)
        self.owned.clear()
        self.buffers.clear()
        self.steps.clear()
        self.closed = True

    def release(self) -> None:
        """Free this executable's device buffers (`dif.backend.Executable.release`): `close`."""
        self.close()

    def __del__(self) -> None:
        # an executable dropped without close() still gives its buffers back; at interpreter
        # shutdown pyopencl may already be gone
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> OpenCLExecutable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Builder:
    """Places every value, lowers the device nodes and binds the launches (see module docstring)."""

    def __init__(
        self,
        backend: OpenCLBackend,
        program: Program,
        plan: Plan,
        weights: dict[str, np.ndarray],
        const_env: dict[str, np.ndarray],
        host: list[Node],
        device: list[Node],
    ) -> None:
        self.backend, self.program, self.plan = backend, program, plan
        self.weights, self.const_env, self.host, self.device = weights, const_env, host, device
        self.refs: dict[str, Ref] = {}
        self.sizes: dict[Slot, int] = {}
        self.buffers: dict[Slot, Any] = {}
        self.owned: list[Any] = []
        self.mode = "arena" if plan.arena_bytes <= backend.info.max_alloc_bytes else "pool"

    def _slot(self, key: str, nbytes: int) -> Slot:
        slot = Slot(key)
        self.sizes[slot] = max(self.sizes.get(slot, 0), nbytes)
        return slot

    def _acquire(self, nbytes: int) -> Any:
        try:
            buf = self.backend.pool.acquire(nbytes)
        except DeviceMemoryError as exc:  # name the program and what the device has free
            free = self.backend.budget().free_memory_bytes
            raise DeviceMemoryError("opencl", self.program.name, exc.nbytes, exc.what, free, exc.detail) from exc
        self.owned.append(buf)
        return buf

    def build(self) -> OpenCLExecutable:
        import pyopencl as cl

        program, plan = self.program, self.plan
        types = program.types
        used = {o for n in self.device for o in n.operands} | set(program.outputs)
        host_results = {r.name for n in self.host for r in n.results}
        inputs = {v.name for v in program.inputs}
        streamed = set(plan.streamed)
        stream_refs = self._place_streamed()
        arena_slot = self._slot("arena", plan.arena_bytes) if self.mode == "arena" else None
        input_slots: dict[str, Slot] = {}
        host_uploads: dict[str, np.ndarray] = {}
        for name in used:
            t = types[name]
            if name in inputs:
                input_slots[name] = self._slot(f"in:{name}", t.nbytes)
                self.refs[name] = Ref(input_slots[name], 0, t)
            elif name in self.weights and name not in streamed:
                self.refs[name] = Ref(self._slot(f"w:{name}", t.nbytes), 0, t)
            elif name in self.const_env:
                self.refs[name] = Ref(self._slot(f"const:{name}", t.nbytes), 0, t)
            elif name in host_results:
                host_uploads[name] = np.empty(t.nbytes, np.uint8)
                self.refs[name] = self._value_ref(name, arena_slot)
        self.refs.update(stream_refs)
        aliased = {n.id for n in self.device if all(plan.buffer_by_name[r.name].is_alias for r in n.results)}
        for node in self.device:
            if node.id in aliased:  # a view of its operand, placed when the operand is (below)
                self.refs[node.results[0].name] = self.refs[node.operands[0]].view(0, node.results[0].type.shape)
                continue
            for r in node.results:
                self.refs[r.name] = self._value_ref(r.name, arena_slot)
        ctx = LowerCtx(row_group=self.backend.row_group, max_group=self.backend.info.max_work_group,
                       options=self.backend.options)  # fmt: skip
        sent = {name: _bytes_of(self.weights[name]) for name in streamed} | host_uploads
        sent = {name: data for name, data in sent.items() if data.nbytes}
        first_use = self._first_device_use(set(sent))
        for node in self.device:
            for name in first_use.get(node.id, ()):
                ctx.steps.append(Upload(node.id, self.refs[name], sent[name]))
            if node.id in aliased:
                continue
            ins, outs = [self.refs[o] for o in node.operands], [self.refs[r.name] for r in node.results]
            ctx.steps += lower_node(ctx, node, ins, outs)
        self._slot("scratch", ctx.scratch_bytes)
        self._allocate()
        queue = self.backend.queue
        for slot, buf in self.buffers.items():  # weights and params-only host results: uploaded once
            kind, _, name = slot.key.partition(":")
            host = self.weights.get(name) if kind == "w" else self.const_env.get(name) if kind == "const" else None
            if host is not None and host.nbytes:
                cl.enqueue_copy(queue, buf, _bytes_of(host), is_blocking=False)
        resolve = self.buffers.__getitem__
        steps: list[Step] = list(ctx.steps)
        for step in steps:
            step.bind(self.backend.library, resolve)
        queue.finish()
        outputs = {name: self.refs[name] for name in program.outputs if name in self.refs and name not in inputs}
        return OpenCLExecutable(
            self.backend, program, plan, steps, self.host, self.const_env, input_slots, host_uploads, outputs,
            self.buffers, self.weights, self.owned, self.mode,
        )  # fmt: skip

    def _value_ref(self, name: str, arena_slot: Slot | None) -> Ref:
        """A node result at its planned arena offset, or (pool mode) in a pool buffer of its own."""
        t = self.program.types[name]
        if arena_slot is not None:
            return Ref(arena_slot, self.plan.buffer_by_name[name].offset // t.dtype.itemsize, t)
        return Ref(self._slot(f"val:{name}", t.nbytes), 0, t)

    def _place_streamed(self) -> dict[str, Ref]:
        """Streamed weights where the plan's streaming schedule puts them in one 'stream' buffer."""
        streaming = self.plan.streaming
        if not streaming.blocks:
            return {}
        types = self.program.types
        slot = self._slot("stream", streaming.staging_bytes)
        offsets = streaming.offsets()
        return {name: Ref(slot, off // types[name].dtype.itemsize, types[name]) for name, off in offsets.items()}

    def _first_device_use(self, names: set[str]) -> dict[int, list[str]]:
        """The first device node reading each of `names`, by node id (uploads go right before it)."""
        seen: set[str] = set()
        out: dict[int, list[str]] = {}
        for node in self.device:
            for o in dict.fromkeys(node.operands):
                if o in names and o not in seen:
                    seen.add(o)
                    out.setdefault(node.id, []).append(o)
        return out

    def _allocate(self) -> None:
        """Pool buffers for every slot; in pool mode values reuse buffers after their last use."""
        if self.mode == "pool":
            self._allocate_values()
        for slot, size in self.sizes.items():
            if slot not in self.buffers:
                self.buffers[slot] = self._acquire(size)

    def _allocate_values(self) -> None:
        from dif_backend_opencl.memory import bucket

        free: dict[int, list[Any]] = {}
        by_step = sorted(
            (b for b in self.plan.buffers if Slot(f"val:{b.name}") in self.sizes), key=lambda b: (b.first_use, b.name)
        )
        ends = sorted(by_step, key=lambda b: b.last_use)
        done = 0
        for b in by_step:
            while done < len(ends) and ends[done].last_use < b.first_use:
                old = self.buffers[Slot(f"val:{ends[done].name}")]
                free.setdefault(int(old.size), []).append(old)
                done += 1
            size = bucket(b.nbytes)
            reuse = free.get(size)
            self.buffers[Slot(f"val:{b.name}")] = reuse.pop() if reuse else self._acquire(b.nbytes)
