"""The CUDA executor (last stage of the pipeline): a program + plan prepared on one device.

`CudaExecutable.create` checks the plan, makes the plan's arena ONE device allocation, uploads the
resident weights into one more (from host or mmap'd arrays, on several threads and streams: `upload`),
copies the streamed weights once into one pinned host buffer and gives them the plan's
device staging slots (`streaming` executes the plan's streaming schedule), gives the program inputs
fixed slots, lowers every node to steps over those addresses with the streaming copies and waits
interleaved, runs the steps once, and captures them all as one CUDA graph. `run` copies the inputs
into their slots, replays the graph (or the steps, with graph=False) and reads the outputs back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from attrs import define, field

from dif.backend_checks import check_inputs, check_plan_binding, check_weights
from dif.errors import DeviceMemoryError
from dif.ir.program import Program, Value
from dif.ir.types import TensorType
from dif.plan.plan import Plan, align_up
from dif.weights.scan import has_nonfinite
from dif_backend_cuda import trace as cuda_trace
from dif_backend_cuda.lower import DevTensor, Launch, LowerCtx, arena_tensor, lower_node
from dif_backend_cuda.streaming import StreamOp, StreamSchedule, WeightStreamer, fill_pinned, stream_schedule
from dif_backend_cuda.upload import empty_pinned, upload
from dif_backend_cuda.weight_scan import nonfinite_tensors

BACKEND = "cuda"
H2D, D2H = 1, 2
STREAM_STEP = -1
"""`step_nodes` entry of a weight-streaming step (it belongs to no node)."""


def _pack(values: Iterable[Value]) -> tuple[dict[str, int], int]:
    """Aligned byte offsets for `values` laid out one after another, and the total size."""
    offsets, total = {}, 0
    for v in values:
        offsets[v.name] = total
        total += align_up(v.type.nbytes)
    return offsets, total


COPY_GAP = 1 << 16
"""Input slots fewer than this many bytes apart are copied to the device as one range: moving the bytes between
costs less than another copy's call."""


def copy_ranges(slots: Iterable[tuple[int, int]], gap: int = COPY_GAP) -> list[tuple[int, int]]:
    """(offset, bytes) of the copies that move every (offset, bytes) of `slots`, in offset order: slots that
    overlap, touch or lie fewer than `gap` bytes apart share one copy."""
    ranges: list[list[int]] = []
    for off, n in sorted(s for s in slots if s[1] > 0):
        if ranges and off - (ranges[-1][0] + ranges[-1][1]) < gap:
            ranges[-1][1] = max(ranges[-1][1], off + n - ranges[-1][0])
        else:
            ranges.append([off, n])
    return [(off, n) for off, n in ranges]


def _device_alloc(nbytes: int, what: str, program: str = "") -> Any:
    import cupy

    try:
        return cupy.cuda.Memory(max(nbytes, 1))
    except cupy.cuda.memory.OutOfMemoryError as exc:
        try:
            free: int | None = int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:  # the device may be past answering; the error still names the request
            free = None
        raise DeviceMemoryError(BACKEND, program, nbytes, what, free, str(exc)) from exc


def _frozen(arr: np.ndarray) -> bool:
    """Whether nothing can change `arr`'s values: it is read-only and owns its memory, or views an array that
    is itself frozen (a read-only view of a writeable array can change through that array)."""
    while not arr.flags.writeable:
        if arr.flags.owndata:
            return True
        if not isinstance(arr.base, np.ndarray):
            return False
        arr = arr.base
    return False


@define
class CudaExecutable:
    """A program prepared on a CUDA device. `run` is not reentrant (one arena, one stream)."""

    program: Program
    plan: Plan
    backend: Any
    steps: list[Any]
    tensors: dict[str, DevTensor]
    memory: dict[str, Any]
    in_host: dict[str, np.ndarray]
    out_host: dict[str, np.ndarray]
    choices: dict[int, str]
    step_nodes: list[int] = field(factory=list)
    graph: Any = None
    graph_error: str = ""
    timings: dict[str, float] = field(factory=dict)
    streamer: WeightStreamer | None = None  # owns the side stream and events the steps (and graph) use
    staged: dict[str, np.ndarray] = field(factory=dict)  # the read-only inputs now in the pinned mirrors
    unsent: list[str] = field(factory=list)  # inputs staged since the last upload, not yet in their device slots

    @classmethod
    def create(
        cls,
        backend: Any,
        program: Program,
        plan: Plan,
        weights: Mapping[str, Any],
        nonfinite_check: Callable[[set[str], set[str]], None] | None = None,
    ) -> CudaExecutable:
        """Prepare `program` (the module docstring says how). The resident weights upload on their lanes
        while this thread lowers the nodes: their addresses are fixed by then, and nothing runs before
        both are done. `nonfinite_check`: called before the first run with the parameters found holding
        NaN / inf (the resident ones tested on the device, `weight_scan`) and those tested."""
        import cupy

        t0 = time.perf_counter()
        check_plan_binding(program, plan, BACKEND)
        # `upload` and `fill_pinned` below take the caller's objects, not the arrays this returns:
        # perf/dif_device_bridge.py hands in device tensors that only look like arrays (shape, dtype)
        check_weights(program, weights, BACKEND)
        streams = stream_schedule(program, plan)  # raises before anything is allocated
        stream = backend.stream
        memory = {"arena": _device_alloc(plan.arena_bytes, "plan arena", program.name)}
        types = program.types
        resident = [Value(name, types[name]) for name in streams.resident]
        w_off, w_total = _pack(resident)
        memory["weights"] = _device_alloc(w_total, "resident weights", program.name)
        in_off, in_total = _pack(program.inputs)
        memory["inputs"] = _device_alloc(in_total, "input slots", program.name)
        tensors: dict[str, DevTensor] = {}
        for v in resident:
            tensors[v.name] = DevTensor(memory["weights"].ptr + w_off[v.name], v.type.shape, v.type.dtype)
        for v in program.inputs:
            tensors[v.name] = DevTensor(memory["inputs"].ptr + in_off[v.name], v.type.shape, v.type.dtype)
        for node in program.nodes:
            for r in node.results:
                tensors[r.name] = arena_tensor(memory["arena"].ptr, plan.buffer_by_name[r.name], r.type)
        timings: dict[str, float] = {}
        device = cupy.cuda.Device()  # the calling thread's; a new thread would start on device 0

        def upload_resident() -> float:
            with device:
                return upload(memory["weights"].ptr, [(w_off[v.name], weights[v.name]) for v in resident], stream)

        # leaving the block waits for the upload whatever happens: an error while lowering never frees memory
        # a copy is still writing
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dif-upload") as pool:
            uploading = pool.submit(upload_resident)
            exe, meta = cls._lower(backend, program, plan, weights, streams, memory, tensors, timings)
            timings["upload_s"] = uploading.result()
        exe._finish(meta, weights, streams, nonfinite_check)
        timings.update(_residency_figures(streams, w_total))
        exe._warm_and_capture()
        timings["prepare_s"] = time.perf_counter() - t0
        cuda_trace.prepared(exe)  # DIF_TRACE_FILE / DIF_NVTX
        return exe

    @classmethod
    def _lower(
        cls,
        backend: Any,
        program: Program,
        plan: Plan,
        weights: Mapping[str, Any],
        streams: StreamSchedule,
        memory: dict[str, Any],
        tensors: dict[str, DevTensor],
        timings: dict[str, float],
    ) -> tuple[CudaExecutable, np.ndarray]:
        """`create`'s work while the resident weights upload: the streamed weights pinned, the pinned
        mirrors of inputs and outputs, every node lowered to steps; returns the executable and the
        kernels' metadata (uploaded by `_finish`)."""
        types = program.types
        streamer = None
        if streams.blocks:
            memory["staging"] = _device_alloc(streams.staging_bytes, "weight staging slots", program.name)
            memory["pinned"] = empty_pinned(streams.pinned_bytes)
            placed = streams.placements()
            for name, (dev_off, _host_off) in placed.items():
                t = types[name]
                tensors[name] = DevTensor(memory["staging"].ptr + dev_off, t.shape, t.dtype)
            t1 = time.perf_counter()
            fill_pinned(memory["pinned"], [(host_off, weights[name]) for name, (_d, host_off) in placed.items()])
            timings["pin_s"] = time.perf_counter() - t1
            streamer = WeightStreamer(streams, memory["staging"].ptr, memory["pinned"].ctypes.data)
        # pinned host mirrors of the input slots and outputs: one H2D copy in, one D2H copy per output
        in_off, in_total = _pack(program.inputs)
        in_pinned = empty_pinned(max(in_total, 1))
        in_host = {v.name: _typed(in_pinned, in_off[v.name], v.type) for v in program.inputs}
        out_values = program.output_values
        out_off, out_total = _pack(out_values)
        out_pinned = empty_pinned(max(out_total, 1))
        out_host = {v.name: _typed(out_pinned, out_off[v.name], v.type) for v in out_values}
        memory["in_pinned"], memory["out_pinned"] = in_pinned, out_pinned

        t_lower = time.perf_counter()
        ctx = LowerCtx(backend, backend.table)
        steps: list[Any] = []
        step_nodes: list[int] = []
        nodes = program.node_by_id
        for item in streams.timeline:
            if isinstance(item, StreamOp):
                assert streamer is not None
                steps.append(streamer.step(item))
                step_nodes.append(STREAM_STEP)
                continue
            node = nodes[plan.schedule[item]]
            lowered = lower_node(
                ctx, node, [tensors[o] for o in node.operands], [tensors[r.name] for r in node.results]
            )
            steps += lowered
            step_nodes += [node.id] * len(lowered)
        timings["lower_s"] = time.perf_counter() - t_lower
        meta = np.concatenate(ctx.meta_chunks) if ctx.meta_chunks else np.zeros(1, np.int64)
        exe = cls(
            program,
            plan,
            backend,
            steps,
            tensors,
            memory,
            in_host,
            out_host,
            dict(ctx.choices),
            step_nodes=step_nodes,
            timings=timings,
            streamer=streamer,
        )
        return exe, meta

    def _finish(
        self,
        meta: np.ndarray,
        weights: Mapping[str, Any],
        streams: StreamSchedule,
        nonfinite_check: Callable[[set[str], set[str]], None] | None,
    ) -> None:
        """After the upload: the kernels' metadata uploaded and bound, and the weights tested for NaN / inf."""
        stream = self.backend.stream
        self.memory["meta"] = _device_alloc(meta.nbytes, "kernel metadata", self.program.name)
        upload(self.memory["meta"].ptr, [(0, meta)], stream)
        for s in self.steps:
            if isinstance(s, Launch):
                s.resolve(self.memory["meta"].ptr)
        if nonfinite_check is not None:
            t0 = time.perf_counter()
            streamed = streams.placements()
            resident = [(name, self.tensors[name]) for name in streams.resident]
            flagged = nonfinite_tensors(resident, self.backend.kernels, int(self.backend.props["sm_count"]), stream)
            flagged |= {name for name in streamed if has_nonfinite(np.asarray(weights[name]))}
            nonfinite_check(flagged, set(streams.resident) | set(streamed))
            self.timings["scan_s"] = time.perf_counter() - t0

    def _warm_and_capture(self) -> None:
        """Run every step once (libraries finish their lazy setup outside capture), then capture."""
        stream = self.backend.stream
        self._eager(stream)
        stream.synchronize()
        if not self.backend.options["graph"] or not self.steps:
            return
        try:
            stream.begin_capture()
            try:
                self._eager(stream)
            finally:
                graph = stream.end_capture()
            self.graph = graph
        except Exception as exc:  # keep running eagerly, and say why
            self.graph_error = f"{type(exc).__name__}: {exc}"
            self.graph = None

    def _eager(self, stream: Any) -> None:
        for step in self.steps:
            step(stream)

    def execute(self) -> None:
        """Enqueue the whole program once (graph replay or eager steps) on the backend's stream."""
        stream = self.backend.stream
        if self.graph is not None:
            self.graph.launch(stream)
        else:
            self._eager(stream)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute once; `inputs` by program input name, outputs as fresh host arrays by name."""
        if (traced := cuda_trace.traced_run(self, inputs)) is not None:  # tracing / DIF_CAPTURE / DIF_NVTX
            return traced
        return self.replay(inputs)

    def stage_inputs(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Check `inputs` and copy them into the pinned host mirrors of the input slots. A frozen array
        (`_frozen`) that was this input at the previous run too is not copied again, neither here nor to the
        device (`upload_inputs`): a denoiser passes the same text features and RoPE tables every step (klein 9B
        at 1024^2: 17 MB a step, milliseconds of host copying and about 0.7 ms of the copy to the device)."""
        for name, arr in check_inputs(self.program, inputs, BACKEND).items():
            frozen = _frozen(arr)
            if not frozen or self.staged.get(name) is not arr:
                np.copyto(self.in_host[name], arr, casting="no")
                self.unsent.append(name)
            if frozen:
                self.staged[name] = arr
            else:
                self.staged.pop(name, None)

    def upload_inputs(self, stream: Any) -> int:
        """Copy the input slots staged since the last upload to the device (`copy_ranges` of them), on `stream`;
        the bytes copied."""
        import cupy

        pinned, device = self.memory["in_pinned"].ctypes.data, self.memory["inputs"].ptr
        slots = [(self.in_host[n].ctypes.data - pinned, self.in_host[n].nbytes) for n in dict.fromkeys(self.unsent)]
        self.unsent.clear()
        moved = 0
        for off, n in copy_ranges(slots):
            cupy.cuda.runtime.memcpyAsync(device + off, pinned + off, n, H2D, stream.ptr)
            moved += n
        return moved

    def replay(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The untraced run: the inputs staged since the last run up, the program (graph replay or eager), the
        outputs down."""
        import cupy

        self.stage_inputs(inputs)
        stream = self.backend.stream
        rt = cupy.cuda.runtime
        self.upload_inputs(stream)
        self.execute()
        for name, host in self.out_host.items():
            if host.nbytes:
                rt.memcpyAsync(host.ctypes.data, self.tensors[name].ptr, host.nbytes, D2H, stream.ptr)
        stream.synchronize()
        return {name: host.copy() for name, host in self.out_host.items()}

    def release(self) -> None:
        """Free this executable's device memory (`dif.backend.Executable.release`): wait for its work,
        drop the graph (it holds the arena's addresses), the steps, the streamer, and every allocation
        (arena, resident weights, input slots, staging, metadata, the pinned host buffers); unused
        pinned blocks go back from CuPy's pool. The executable cannot run afterwards; prepare again."""
        import cupy

        self.backend.stream.synchronize()
        self.graph = None
        self.steps.clear()
        self.step_nodes.clear()
        self.streamer = None
        self.tensors.clear()
        self.in_host.clear()
        self.staged.clear()
        self.unsent.clear()
        self.out_host.clear()
        self.memory.clear()  # cupy frees a Memory when its last reference goes
        cupy.get_default_pinned_memory_pool().free_all_blocks()

    def profile(self, iters: int = 3, by: str = "op") -> dict[str, dict[str, float]]:
        """Device milliseconds per op (eager, a CUDA event after every step; mean over `iters` runs) and
        step counts: {key: {"ms": ..., "steps": ...}}. Launch gaps of tiny steps count toward their op.
        `by="shape"` splits each op by operand/result shapes and the lowering chosen, which tells apart
        e.g. the GEMMs of one model (what a per-op total cannot say); `by="step"` by op and step (a kernel's
        name, else the step's kind): where a lowering of several steps spends its time."""
        import cupy

        if by not in ("op", "shape", "step"):
            raise ValueError(f"profile by 'op', 'shape' or 'step', not {by!r}")
        stream = self.backend.stream
        events = [cupy.cuda.Event() for _ in range(len(self.steps) + 1)]
        # a streaming step is timed under its kind: "stream-wait" is how long the main stream stalled
        # for a weight block still on its way
        keys = [
            s.kind if n == STREAM_STEP else self._profile_key(n, by, s)
            for n, s in zip(self.step_nodes, self.steps, strict=True)
        ]
        out: dict[str, dict[str, float]] = {}
        for key in keys:
            out.setdefault(key, {"ms": 0.0, "steps": 0})["steps"] += 1
        for _ in range(iters):
            events[0].record(stream)
            for k, step in enumerate(self.steps):
                step(stream)
                events[k + 1].record(stream)
            events[-1].synchronize()
            for k, key in enumerate(keys):
                out[key]["ms"] += cupy.cuda.get_elapsed_time(events[k], events[k + 1]) / iters
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))

    def _profile_key(self, node_id: int, by: str, step: Any) -> str:
        node = self.program.node_by_id[node_id]
        if by == "op":
            return node.op
        if by == "step":
            return f"{node.op}: {getattr(step, 'name', step.kind)}"
        types = self.program.types
        shapes = ",".join("x".join(map(str, types[name].shape)) if name in types else "-" for name in node.operands)
        results = ",".join("x".join(map(str, r.type.shape)) for r in node.results)
        return f"{node.op} {shapes} -> {results} [{self.choices.get(node_id, '')}]"

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for s in self.steps:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        graph = "captured" if self.graph is not None else f"eager ({self.graph_error or 'graph disabled'})"
        t = self.timings
        weights = f"weights resident {int(t.get('resident_bytes', 0))} B"
        if t.get("streamed_blocks"):
            weights += (
                f", streamed {int(t['streamed_bytes'])} B in {int(t['streamed_blocks'])} blocks "
                f"(pinned {int(t['pinned_bytes'])} B, staging {int(t['staging_bytes'])} B)"
            )
        return f"cuda executable '{self.program.name}': {len(self.steps)} steps {kinds}, graph {graph}; {weights}"


def _residency_figures(streams: StreamSchedule, resident_bytes: int) -> dict[str, float]:
    """Byte figures of where the weights went, kept in the executable's `timings` next to the seconds
    (perf scripts record that dict whole). Streamed bytes are what the parameters hold; the others are
    allocations (each parameter aligned)."""
    return {
        "resident_bytes": resident_bytes,
        "streamed_bytes": streams.streamed_bytes,
        "streamed_params": len(streams.streamed),
        "streamed_blocks": len(streams.blocks),
        "pinned_bytes": streams.pinned_bytes,
        "staging_bytes": streams.staging_bytes,
    }


def _typed(buf: np.ndarray, offset: int, t: TensorType) -> np.ndarray:
    return buf[offset : offset + t.nbytes].view(t.dtype.np).reshape(t.shape)
