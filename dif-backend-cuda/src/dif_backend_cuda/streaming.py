"""Weight streaming for the CUDA executor (backend side, after planning, while `create` builds its steps).

The planner marked some parameters "streamed". `stream_schedule` (pure Python, no cupy) groups them
into the planner's weight blocks, orders the blocks by first use, lays each out once in pinned host
memory and in one of two device staging slots (block i in slot i % 2), and interleaves the
side-stream operations with the schedule positions. `WeightStreamer` turns those operations into
steps `step(stream)`, so the copies are captured in the executor's one CUDA graph with the kernels:

    fork                      main records an event; the side stream waits on it (joins the capture)
    copy i                    side: wait until block i-2 is released, copy block i H2D, record loaded[i]
    wait i                    main: wait for loaded[i], just before the first step that reads block i
    free i                    main: record that block i is done, after its last step (block i+2 may come in)
    join                      main waits for the side stream's last copy (every forked stream rejoins)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from attrs import frozen

from dif.errors import BackendError
from dif.ir.program import Program
from dif.plan.plan import ALIGNMENT, STREAMED, Plan, align_up
from dif.plan.planner import weight_blocks

FORK, COPY, WAIT, FREE, JOIN = "fork", "copy", "wait", "free", "join"
SLOTS = 2
H2D = 1


@frozen
class StreamBlock:
    """Streamed parameters copied together. `offsets[k]` is where `params[k]` starts inside the block,
    the same in its pinned region (at `host_offset`) and in its device slot; `nbytes` spans the block
    (every parameter starts on an `ALIGNMENT` boundary), `param_bytes` is what its parameters hold.
    `first_use` / `last_use` are schedule positions."""

    key: str
    params: tuple[str, ...]
    offsets: tuple[int, ...]
    nbytes: int
    param_bytes: int
    host_offset: int
    slot: int
    first_use: int
    last_use: int


@frozen
class StreamOp:
    """One side-stream operation in the timeline; `block` indexes `StreamSchedule.blocks` (-1: none)."""

    kind: str
    block: int = -1


@frozen
class StreamSchedule:
    """Where streamed weights live and when they move. `timeline` lists schedule positions (ints: lower
    node `plan.schedule[p]` there) and `StreamOp`s in the order the executor issues them. `resident`
    names the parameters kept on the device for the whole run, in program order."""

    blocks: tuple[StreamBlock, ...]
    timeline: tuple[int | StreamOp, ...]
    resident: tuple[str, ...]
    slot_bytes: int

    @property
    def slots(self) -> int:
        return min(SLOTS, len(self.blocks))

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
        for b in self.blocks:
            for name, off in zip(b.params, b.offsets, strict=True):
                out[name] = (b.slot * self.slot_bytes + off, b.host_offset + off)
        return out


def stream_schedule(program: Program, plan: Plan) -> StreamSchedule:
    """The streaming layout and timeline of `plan`'s streamed parameters (see the module docstring).

    A streamed parameter that no node reads, or that is a program output, stays resident: the first
    has no use to copy it before, the second must still be in place when `run` reads the outputs.
    Raises `BackendError` when double buffering cannot work: block i reuses the slot of block i-2, so
    block i-2 must be done (last use) before block i is first needed."""
    users: dict[str, list[int]] = {}
    nodes = program.node_by_id
    for pos, node_id in enumerate(plan.schedule):
        for name in dict.fromkeys(nodes[node_id].operands):
            users.setdefault(name, []).append(pos)
    outputs = set(program.outputs)
    streamed = {
        p.name
        for p in program.params
        if plan.residency.get(p.name) == STREAMED and p.name in users and p.name not in outputs
    }
    sizes = {p.name: p.type.nbytes for p in program.params}
    groups = []
    for key, names in weight_blocks(program).items():
        members = [n for n in names if n in streamed]  # program order
        if members:
            groups.append((min(users[n][0] for n in members), key, members))
    groups.sort()
    blocks: list[StreamBlock] = []
    host = 0
    for i, (first, key, members) in enumerate(groups):
        offsets, end = [], 0
        for name in members:
            offsets.append(end)
            end += align_up(sizes[name], ALIGNMENT)
        last = max(users[n][-1] for n in members)
        held = sum(sizes[n] for n in members)
        blocks.append(StreamBlock(key, tuple(members), tuple(offsets), end, held, host, i % SLOTS, first, last))
        host += end
    _check_double_buffering(program, plan, blocks)
    resident = tuple(p.name for p in program.params if p.name not in streamed)
    slot_bytes = max((b.nbytes for b in blocks), default=0)
    return StreamSchedule(tuple(blocks), _timeline(len(plan.schedule), blocks), resident, slot_bytes)


def _check_double_buffering(program: Program, plan: Plan, blocks: list[StreamBlock]) -> None:
    for prev, block in zip(blocks, blocks[SLOTS:], strict=False):
        if prev.last_use >= block.first_use:
            raise BackendError(
                f"cuda backend: cannot stream the weights of '{program.name}' through {SLOTS} staging slots: "
                f"{prev.key} is still read at schedule step {prev.last_use} (node {plan.schedule[prev.last_use]}), "
                f"but {block.key}, which takes over its slot, is first read at step {block.first_use} "
                f"(node {plan.schedule[block.first_use]})",
                hint="plan with a larger budget so one of these blocks stays resident, or give the frontend's "
                "weights provenance blocks that are used one after another",
            )


def _timeline(steps: int, blocks: list[StreamBlock]) -> tuple[int | StreamOp, ...]:
    if not blocks:
        return tuple(range(steps))
    first: dict[int, list[int]] = {}
    last: dict[int, list[int]] = {}
    for i, b in enumerate(blocks):
        first.setdefault(b.first_use, []).append(i)
        last.setdefault(b.last_use, []).append(i)
    out: list[int | StreamOp] = [StreamOp(FORK)]
    freed: set[int] = set()
    issued = 0

    def issue() -> None:
        # copies go out in block order, each as soon as the slot it overwrites is released: the side
        # stream is in order, so a later block issued first would only delay an earlier one
        nonlocal issued
        while issued < len(blocks) and (issued < SLOTS or issued - SLOTS in freed):
            out.append(StreamOp(COPY, issued))
            issued += 1

    issue()
    for pos in range(steps):
        for i in first.get(pos, ()):
            assert i < issued, "double buffering was checked: every block is copied before it is waited for"
            out.append(StreamOp(WAIT, i))
        out.append(pos)
        for i in last.get(pos, ()):
            if i + SLOTS < len(blocks):  # nobody waits for the release of the last two blocks
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
        if i >= SLOTS:
            self.side.wait_event(self.released[i - SLOTS])
        dst = self.staging_ptr + block.slot * self.schedule.slot_bytes
        self._memcpy(dst, self.pinned_ptr + block.host_offset, block.nbytes, H2D, self.side.ptr)
        self.loaded[i].record(self.side)

    def _join(self, stream: Any) -> None:
        self.joined.record(self.side)
        stream.wait_event(self.joined)
