"""The cuda backend's trace, capture and NVTX points (`dif.trace`): called by one line each from
`CudaExecutable.create` (prepare) and `CudaExecutable.run`.

With nothing listening and DIF_NVTX off, `traced_run` returns None and the executable replays its CUDA
graph as always. With DIF_NVTX=1 alone, the replay is wrapped in a `dif::run` range. When tracing or
capturing, the run goes eagerly step by step (a graph replay has no per-op boundaries): a CUDA event
before and after each node's steps times it on the device (launch gaps between nodes stay unattributed),
each event names the kernels / library paths that ran it, weight-streaming steps are `copy.h2d` / `wait`
/ `sync` events, the input and output copies are `copy.h2d` / `copy.d2h`; with DIF_NVTX=1 every node is
also an `op<id> <opcode>` range. DIF_CAPTURE copies each captured node's results to the host right after
its steps (a later node may reuse the bytes).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from dif import trace
from dif.env import DIF_NVTX
from dif.trace.vocabulary import ALLOC, COPY_D2H, COPY_H2D, SYNC, WAIT

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

CudaExecutable = Any  # dif_backend_cuda.executor.CudaExecutable (which imports this module)

D2H_KIND = 2  # cudaMemcpyDeviceToHost


@contextmanager
def nvtx_range(name: str, on: bool) -> Iterator[None]:
    """An NVTX range (CuPy's bindings) around the block when `on`."""
    if not on:
        yield
        return
    from cupy.cuda import nvtx

    nvtx.RangePush(name)
    try:
        yield
    finally:
        nvtx.RangePop()


def prepared(exe: CudaExecutable) -> None:
    """Record the prepare of `exe`: its device allocations and the weight upload."""
    with nvtx_range("dif::prepare", DIF_NVTX.get_bool()):
        rec = trace.begin("prepare", exe.program, "cuda")
        if rec is None:
            return
        rec.start = rec.clock() - exe.timings.get("prepare_s", 0.0)  # the wall of the whole prepare
        for what, mem in exe.memory.items():
            nbytes = int(getattr(mem, "nbytes", 0) or getattr(getattr(mem, "mem", None), "size", 0) or 0)
            rec.event(ALLOC, nbytes=nbytes, what=what)
        t = exe.timings
        rec.event(COPY_H2D, ms=t.get("upload_s", 0.0) * 1000.0, nbytes=int(t.get("resident_bytes", 0)), what="weights")
        rec.finish()


def _groups(exe: CudaExecutable) -> list[tuple[str, int, list[int]]]:
    """The steps in order as ("node", id, step indices) / ("stream", -1, [index]); nodes without device
    work (views) get an empty group at their place in the schedule."""
    position = {n: i for i, n in enumerate(exe.plan.schedule)}
    out: list[tuple[str, int, list[int]]] = []
    done = -1
    for k, node_id in enumerate(exe.step_nodes):
        if node_id < 0:  # the executor's STREAM_STEP: a weight-streaming step, no node
            out.append(("stream", -1, [k]))
            continue
        if out and out[-1][0] == "node" and out[-1][1] == node_id:
            out[-1][2].append(k)
            continue
        for p in range(done + 1, position[node_id]):
            out.append(("node", exe.plan.schedule[p], []))
        done = position[node_id]
        out.append(("node", node_id, [k]))
    for p in range(done + 1, len(exe.plan.schedule)):
        out.append(("node", exe.plan.schedule[p], []))
    return out


def _to_host(t: Any) -> np.ndarray:
    """A device tensor's bytes on the host (pitched views row by row), as its dtype and shape."""
    import cupy

    rt = cupy.cuda.runtime
    size = t.dtype.itemsize
    host = np.empty(t.nbytes, dtype=np.uint8)
    if t.nbytes:
        if t.pitched:
            rows = t.numel // t.row
            rt.memcpy2D(host.ctypes.data, t.row * size, t.ptr, t.pitch * size, t.row * size, rows, D2H_KIND)
        else:
            rt.memcpy(host.ctypes.data, t.ptr, t.nbytes, D2H_KIND)
    return host.view(t.dtype.np).reshape(t.shape)


def _impl(exe: CudaExecutable, node_id: int, steps: list[int]) -> str:
    names = []
    for k in steps:
        step = exe.steps[k]
        names.append(getattr(step, "name", "") or step.kind)
    choice = exe.choices.get(node_id, "")
    text = ", ".join(dict.fromkeys(names)) or "no device work (view)"
    return f"{choice}: {text}" if choice else text


def traced_run(exe: CudaExecutable, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Run `exe` traced / captured / under NVTX; None when none of them is on (the caller replays)."""
    nvtx = DIF_NVTX.get_bool()
    rec = trace.begin("run", exe.program, "cuda", exe.plan.schedule)
    if rec is None and not nvtx:
        return None
    with nvtx_range("dif::run", nvtx):
        if rec is None:  # NVTX only: the usual replay inside the range
            return exe.replay(inputs)
        exe.stage_inputs(inputs)
        return _eager_traced(exe, rec, exe.backend.stream, nvtx)


def _eager_traced(exe: CudaExecutable, rec: trace.Recorder, stream: Any, nvtx: bool) -> dict[str, np.ndarray]:
    import cupy

    rt = cupy.cuda.runtime
    first = cupy.cuda.Event()
    first.record(stream)
    marks: list[tuple[str, int, list[int], Any, Any, list[np.ndarray]]] = []
    ev_in = (cupy.cuda.Event(), cupy.cuda.Event())
    ev_in[0].record(stream)
    in_bytes = exe.upload_inputs(stream)
    ev_in[1].record(stream)
    nodes = exe.program.node_by_id
    for kind, node_id, steps in _groups(exe):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        label = f"op{node_id} {nodes[node_id].op}" if kind == "node" else exe.steps[steps[0]].kind
        with nvtx_range(label, nvtx):
            start.record(stream)
            for k in steps:
                exe.steps[k](stream)
            end.record(stream)
        captured: list[np.ndarray] = []
        if kind == "node" and rec.wants_capture(nodes[node_id]):
            stream.synchronize()
            captured = [_to_host(exe.tensors[r.name]) for r in nodes[node_id].results]
        marks.append((kind, node_id, steps, start, end, captured))
    ev_out = (cupy.cuda.Event(), cupy.cuda.Event())
    ev_out[0].record(stream)
    for name, host in exe.out_host.items():
        if host.nbytes:
            rt.memcpyAsync(host.ctypes.data, exe.tensors[name].ptr, host.nbytes, D2H_KIND, stream.ptr)
    ev_out[1].record(stream)
    stream.synchronize()

    def ms(a: Any, b: Any) -> float:
        return float(cupy.cuda.get_elapsed_time(a, b))

    rec.event(COPY_H2D, ms=ms(*ev_in), nbytes=in_bytes, what="inputs")
    for kind, node_id, steps, start, end, captured in marks:
        if kind == "stream":
            step_kind = exe.steps[steps[0]].kind
            vocab = WAIT if step_kind.endswith("wait") else (COPY_H2D if step_kind.endswith("copy") else SYNC)
            rec.event(vocab, ms=ms(start, end), what=step_kind, start_ms=round(ms(first, start), 6))
            continue
        rec.op(
            nodes[node_id],
            0.0,
            captured,
            impl=_impl(exe, node_id, steps),
            ms=ms(start, end),
            start_ms=ms(first, start),
            steps=len(steps),
        )
    rec.event(COPY_D2H, ms=ms(*ev_out), nbytes=sum(int(h.nbytes) for h in exe.out_host.values()), what="outputs")
    rec.finish()
    return {name: host.copy() for name, host in exe.out_host.items()}
