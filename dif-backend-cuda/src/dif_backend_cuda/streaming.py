"""Weight streaming for the CUDA executor (backend side, after planning, while `create` builds its steps).

The plan records the streaming schedule (`dif.plan.streaming`: blocks in copy order, their slot and
offsets there, first and last use, the slot's previous tenant). `stream_schedule` (pure Python, no
cupy) executes exactly that: it lays the blocks out back to back in one pinned host buffer (each in
the layout of its slot, so one copy moves a block) and interleaves the side-stream operations with
the schedule positions. `WeightStreamer` turns those operations into steps `step(stream)`, so the
copies are captured in the executor's one CUDA graph with the kernels:

    fork                      main records an event; the side stream waits on it (joins the capture)
    copy i                    side: wait until the slot's previous tenant is released, copy block i H2D,
                              record loaded[i]
    wait i                    main: wait for loaded[i], just before the first step that reads block i
    free i                    main: record that block i is done, after its last step (its slot's next
                              tenant may come in)
    join                      main waits for the side stream's last copy (every forked stream rejoins)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from attrs import frozen

from dif.errors import BackendError
from dif.ir.program import Program
from dif.plan.plan import Plan
from dif.plan.streaming import StreamBlock

FORK, COPY, WAIT, FREE, JOIN = "fork", "copy", "wait", "free", "join"
H2D = 1


@frozen
class StreamOp:
    """One side-stream operation in the timeline; `block` indexes `StreamSchedule.blocks` (-1: none)."""

    kind: str
    block: int = -1


@frozen
class StreamSchedule:
    """The plan's streaming schedule as the executor issues it. `blocks` are the plan's; block i lies at
    `host_offsets[i]` of the pinned buffer. `timeline` lists schedule positions (ints: lower node
    `plan.schedule[p]` there) and `StreamOp`s in issue order. `resident` names the parameters kept on
    the device for the whole run, in program order; `streamed_bytes` is what the streamed ones hold."""

    blocks: tuple[StreamBlock, ...]
    host_offsets: tuple[int, ...]
    timeline: tuple[int | StreamOp, ...]
    resident: tuple[str, ...]
    slots: int
    slot_bytes: int
    streamed_bytes: int

    @property
    def staging_bytes(self) -> int:
        return self.slots * self.slot_bytes

    @property
    def pinned_bytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    @property
    def streamed(self) -> tuple[str, ...]:
        return tuple(name for b in self.blocks for name in b.params)

    def placements(self) -> dict[str, tuple[int, int]]:
        """(device offset from the staging base, pinned offset) of every streamed parameter."""
        out = {}
        for b, host in zip(self.blocks, self.host_offsets, strict=True):
            for name, off in zip(b.params, b.offsets, strict=True):
                out[name] = (b.slot * self.slot_bytes + off, host + off)
        return out


def stream_schedule(program: Program, plan: Plan) -> StreamSchedule:
    """The pinned layout and the timeline of `plan.streaming` (see the module docstring).

    `check_plan` has checked the schedule against the program (offsets, slots, reads inside each
    block's steps, slot tenants one after another). Raises `BackendError` for a plan this executor
    cannot run: a streamed parameter the plan's residency marks resident, or the reverse."""
    s = plan.streaming
    streamed = set(s.streamed)
    if streamed != set(plan.streamed):
        raise BackendError(
            f"cuda backend: the plan of '{program.name}' streams {len(streamed)} parameters in its blocks but "
            f"marks {len(plan.streamed)} streamed",
            hint="re-plan the program",
        )
    host, offsets = 0, []
    for b in s.blocks:
        offsets.append(host)
        host += b.nbytes
    types = program.types
    resident = tuple(p.name for p in program.params if p.name not in streamed)
    held = sum(types[n].nbytes for n in streamed)
    return StreamSchedule(
        s.blocks, tuple(offsets), _timeline(len(plan.schedule), s.blocks), resident, s.slots, s.slot_bytes, held
    )


def _timeline(steps: int, blocks: tuple[StreamBlock, ...]) -> tuple[int | StreamOp, ...]:
    if not blocks:
        return tuple(range(steps))
    first: dict[int, list[int]] = {}
    last: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        first.setdefault(b.first_use, []).append(i)
        last.setdefault(b.last_use, []).append(i)
    followed = {b.after for b in blocks if b.after >= 0}
    out: list[int | StreamOp] = [StreamOp(FORK)]
    freed: set[int] = set()
    issued = 0

    def issue() -> None:
        # copies go out in block order, each as soon as the slot it overwrites is released: the side
        # stream is in order, so a later block issued first would only delay an earlier one
        nonlocal issued
        while issued < len(blocks) and (blocks[issued].after < 0 or blocks[issued].after in freed):
            out.append(StreamOp(COPY, issued))
            issued += 1

    issue()
    for pos in range(steps):
        for i in first.get(pos, ()):
            if i >= issued:  # check_streaming rules this out: a slot's tenant is released before the next arrives
                raise BackendError(f"cuda backend: streamed block {i} would be waited for before it is copied")
            out.append(StreamOp(WAIT, i))
        out.append(pos)
        for i in last.get(pos, ()):
            if i in followed:  # nobody waits for the release of a slot's last tenant
                out.append(StreamOp(FREE, i))
                freed.add(i)
        issue()
    out.append(StreamOp(JOIN))
    return tuple(out)


def fill_pinned(pinned: np.ndarray, arrays: list[tuple[int, Any]]) -> None:
    """Copy host arrays (numpy, np.memmap) into the pinned buffer `pinned` (uint8) at their offsets.
    perf/dif_device_bridge.py replaces this to bring device tensors down instead."""
    for offset, arr in arrays:
        src = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        pinned[offset : offset + src.size] = src


class StreamStep:
    """One side-stream operation as an executor step: `step(stream)` on the main stream, like a kernel."""

    def __init__(self, kind: str, block: int, run: Any) -> None:
        self.kind = f"stream-{kind}"
        self.block = block
        self._run = run

    def __call__(self, stream: Any) -> None:
        self._run(stream)

    def __repr__(self) -> str:
        return f"StreamStep({self.kind}, block {self.block})"


class WeightStreamer:
    """The device side of a `StreamSchedule`: the side stream, its events, and a step per `StreamOp`.

    The executable owns it (the stream and events must live as long as the captured graph). Events do
    no timing: they only order the two streams."""

    def __init__(self, schedule: StreamSchedule, staging_ptr: int, pinned_ptr: int) -> None:
        import cupy

        self.schedule = schedule
        self.staging_ptr = staging_ptr
        self.pinned_ptr = pinned_ptr
        self.side = cupy.cuda.Stream(non_blocking=True)
        n = len(schedule.blocks)
        self.forked = cupy.cuda.Event(disable_timing=True)
        self.joined = cupy.cuda.Event(disable_timing=True)
        self.loaded = [cupy.cuda.Event(disable_timing=True) for _ in range(n)]
        self.released = [cupy.cuda.Event(disable_timing=True) for _ in range(n)]
        self._memcpy = cupy.cuda.runtime.memcpyAsync

    def step(self, op: StreamOp) -> StreamStep:
        i = op.block
        if op.kind == FORK:
            return StreamStep(FORK, i, self._fork)
        if op.kind == COPY:
            return StreamStep(COPY, i, lambda _stream: self._copy(i))
        if op.kind == WAIT:
            return StreamStep(WAIT, i, lambda stream: stream.wait_event(self.loaded[i]))
        if op.kind == FREE:
            return StreamStep(FREE, i, lambda stream: self.released[i].record(stream))
        if op.kind == JOIN:
            return StreamStep(JOIN, i, self._join)
        raise BackendError(f"cuda backend: unknown stream operation '{op.kind}'")

    def _fork(self, stream: Any) -> None:
        self.forked.record(stream)
        self.side.wait_event(self.forked)

    def _copy(self, i: int) -> None:
        block = self.schedule.blocks[i]
        if block.after >= 0:
            self.side.wait_event(self.released[block.after])
        dst = self.staging_ptr + block.slot * self.schedule.slot_bytes
        host = self.pinned_ptr + self.schedule.host_offsets[i]
        self._memcpy(dst, host, block.nbytes, H2D, self.side.ptr)
        self.loaded[i].record(self.side)

    def _join(self, stream: Any) -> None:
        self.joined.record(self.side)
        stream.wait_event(self.joined)
