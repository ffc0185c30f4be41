"""Weight streaming in the CUDA executor. Without a GPU: the executor takes the plan's streaming
schedule as recorded (blocks, slots, offsets, slot tenants) and interleaves copies and waits with the
schedule (`dif_backend_cuda.streaming.stream_schedule`, no cupy), and `WeightStreamer` on a fake cupy
whose two streams honour only their events has every block in place when it is read. On a GPU
(marker `cuda`, skipped with the reason otherwise): a program whose blocks are mostly streamed gives
bit for bit what the all-resident plan gives, with the graph and without, also when a block read
again keeps its slot."""

from __future__ import annotations

import ctypes
import sys
import types
from collections import deque
from typing import Any

import numpy as np
import pytest
from attrs import evolve

from dif.errors import BackendError, PlanError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.plan import RESIDENT, STREAMED, Plan, check_plan
from dif.plan.planner import plan_program, restream
from dif.plan.streaming import NO_STREAMING
from dif.target import RuntimeBudget, TargetProfile
from dif_backend_cuda.streaming import COPY, FORK, FREE, JOIN, WAIT, StreamOp, fill_pinned, stream_schedule

from .conftest import cuda_skip_reason

PROFILE = TargetProfile(backend="cuda", device="unit", arch="sm_90", dtypes=("f32",), capabilities=("alias:reshape",))
WIDTH = 64
BLOCK_BYTES = WIDTH * WIDTH * 4 + WIDTH * 4  # one linear's weight and bias, f32


def mlp(blocks: int = 4, *, reuse_first_at: int | None = None) -> Program:
    """`blocks` x (linear + silu), each in provenance block blk{i} with its own weight and bias. With
    `reuse_first_at`, block 0's weight is read once more right after block `reuse_first_at`."""
    b = ProgramBuilder("streamed-mlp")
    h = b.input("x", (8, WIDTH), "f32")
    first = None
    for i in range(blocks):
        w = b.param(f"w{i}", (WIDTH, WIDTH), "f32")
        bias = b.param(f"b{i}", (WIDTH,), "f32")
        first = first or w
        with b.scope(module="mlp", block=f"blk{i}"):
            h = b.emit("silu", b.emit("linear", h, w, bias))
        if i == reuse_first_at:
            with b.scope(module="mlp", block=f"blk{i}"):
                h = b.emit("linear", h, first)
    b.output(h)
    return b.build()


def plan_keeping(program: Program, resident_blocks: int, profile: TargetProfile = PROFILE) -> Plan:
    """`program` planned with a budget that leaves `resident_blocks` weight blocks on the device
    (the blocks are of one size, so the planner streams them in key order, blk0 first)."""
    arena = plan_program(program, profile, RuntimeBudget(free_memory_bytes=1 << 40)).arena_bytes
    budget = RuntimeBudget(free_memory_bytes=arena + (resident_blocks + 2) * BLOCK_BYTES)
    return plan_program(program, profile, budget)


def test_everything_resident_means_no_streaming() -> None:
    program = mlp()
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=1 << 40))
    assert plan.streaming == NO_STREAMING
    s = stream_schedule(program, plan)
    assert s.blocks == () and s.slots == 0 and s.pinned_bytes == 0 and s.staging_bytes == 0
    assert s.timeline == tuple(range(len(plan.schedule)))
    assert s.resident == tuple(p.name for p in program.params)


def test_the_executor_takes_the_plans_blocks_slots_and_offsets() -> None:
    program = mlp()
    plan = plan_keeping(program, resident_blocks=0)
    assert set(plan.residency.values()) == {STREAMED}
    s = stream_schedule(program, plan)
    assert s.blocks == plan.streaming.blocks  # as recorded, not regrouped
    assert [b.key for b in s.blocks] == [f"block blk{i}" for i in range(4)]
    assert [b.params for b in s.blocks] == [(f"w{i}", f"b{i}") for i in range(4)]
    assert [b.slot for b in s.blocks] == [0, 1, 0, 1] and [b.after for b in s.blocks] == [-1, -1, 0, 1]
    # linear is node 2i in the schedule; the block's weight and bias are read there only
    assert [(b.first_use, b.last_use) for b in s.blocks] == [(2 * i, 2 * i) for i in range(4)]
    # parameters start on 256-byte boundaries; blocks lie back to back in pinned memory
    assert [b.offsets for b in s.blocks] == [(0, WIDTH * WIDTH * 4)] * 4
    assert s.host_offsets == tuple(i * BLOCK_BYTES for i in range(4))
    assert s.slot_bytes == BLOCK_BYTES and s.slots == 2 and s.staging_bytes == 2 * BLOCK_BYTES
    assert s.pinned_bytes == 4 * BLOCK_BYTES and s.resident == () and s.streamed_bytes == 4 * BLOCK_BYTES
    placed = s.placements()
    w_bytes = WIDTH * WIDTH * 4
    assert placed["w2"] == (0, 2 * BLOCK_BYTES) and placed["b3"] == (BLOCK_BYTES + w_bytes, 3 * BLOCK_BYTES + w_bytes)
    assert s.staging_bytes == plan.staging_bytes == plan.streaming.staging_bytes


def test_copies_and_waits_interleave_with_the_schedule() -> None:
    program = mlp()
    s = stream_schedule(program, plan_keeping(program, resident_blocks=0))
    op = StreamOp
    assert s.timeline == (
        op(FORK), op(COPY, 0), op(COPY, 1),
        op(WAIT, 0), 0, op(FREE, 0), op(COPY, 2), 1,
        op(WAIT, 1), 2, op(FREE, 1), op(COPY, 3), 3,
        op(WAIT, 2), 4, 5,
        op(WAIT, 3), 6, 7,
        op(JOIN),
    )  # fmt: skip


def test_resident_blocks_are_left_out_of_the_timeline() -> None:
    program = mlp()
    plan = plan_keeping(program, resident_blocks=1)
    assert [plan.residency[f"w{i}"] for i in range(4)] == [STREAMED, STREAMED, STREAMED, RESIDENT]
    s = stream_schedule(program, plan)
    assert [b.key for b in s.blocks] == ["block blk0", "block blk1", "block blk2"]
    assert s.resident == ("w3", "b3")
    waits = [item for item in s.timeline if isinstance(item, StreamOp) and item.kind == WAIT]
    assert [w.block for w in waits] == [0, 1, 2]
    copies = [s.timeline.index(StreamOp(COPY, i)) for i in range(3)]
    assert copies == sorted(copies) and s.timeline.index(StreamOp(COPY, 2)) > s.timeline.index(StreamOp(FREE, 0))


def test_a_single_streamed_block_uses_one_slot() -> None:
    program = mlp(blocks=2)
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=1 << 40))
    plan = restream(plan, program, [("block blk0", ["w0", "b0"])])
    s = stream_schedule(program, plan)
    assert len(s.blocks) == 1 and s.slots == 1 and s.staging_bytes == BLOCK_BYTES
    assert s.timeline == (StreamOp(FORK), StreamOp(COPY, 0), StreamOp(WAIT, 0), 0, 1, 2, 3, StreamOp(JOIN))


def test_a_block_read_again_keeps_its_slot() -> None:
    program = mlp(reuse_first_at=2)  # w0 (block blk0) is read again at step 6, after blk2
    plan = plan_keeping(program, resident_blocks=0)
    s = stream_schedule(program, plan)
    assert [(b.first_use, b.last_use) for b in s.blocks] == [(0, 6), (2, 2), (4, 4), (7, 7)]
    # blk2 takes blk1's slot (blk0 still holds slot 0); blk3 the slot released earliest (blk2's, at step 4)
    assert [b.slot for b in s.blocks] == [0, 1, 1, 1] and [b.after for b in s.blocks] == [-1, -1, 1, 2]
    assert s.slots == 2
    t = s.timeline
    assert t.index(StreamOp(COPY, 2)) == t.index(StreamOp(FREE, 1)) + 1
    assert t.index(StreamOp(COPY, 3)) == t.index(StreamOp(FREE, 2)) + 1
    assert StreamOp(FREE, 0) not in t  # no block follows blk0 into slot 0


def test_reuse_within_the_next_block_takes_the_slot_released_first() -> None:
    program = mlp(reuse_first_at=1)  # blk0 is read until step 4; blk1's slot is free from step 2
    s = stream_schedule(program, plan_keeping(program, resident_blocks=0))
    assert (s.blocks[0].first_use, s.blocks[0].last_use, s.blocks[2].first_use) == (0, 4, 5)
    assert (s.blocks[2].slot, s.blocks[2].after, s.blocks[3].slot, s.blocks[3].after) == (1, 1, 0, 0)
    assert s.timeline.index(StreamOp(COPY, 2)) == s.timeline.index(StreamOp(FREE, 1)) + 1


def overlapping() -> Program:
    """Three blocks all read again at the end: at blk2's first read, blk0 and blk1 are both still in use."""
    b = ProgramBuilder("overlapping")
    h = b.input("x", (8, WIDTH), "f32")
    ws = [b.param(f"w{i}", (WIDTH, WIDTH), "f32") for i in range(3)]
    for i, w in enumerate(ws):
        with b.scope(block=f"blk{i}"):
            h = b.emit("linear", h, w)
    for w in ws:
        with b.scope(block="tail"):
            h = b.emit("linear", h, w)
    b.output(h)
    return b.build()


def test_blocks_in_use_together_get_a_slot_each() -> None:
    program = overlapping()
    plan = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=1 << 40))
    plan = restream(plan, program, [(f"block blk{i}", [f"w{i}"]) for i in range(3)])
    s = stream_schedule(program, plan)
    assert [b.slot for b in s.blocks] == [0, 1, 2] and s.slots == 3 and s.staging_bytes == 3 * WIDTH * WIDTH * 4
    assert s.timeline[:4] == (StreamOp(FORK), StreamOp(COPY, 0), StreamOp(COPY, 1), StreamOp(COPY, 2))
    assert not any(isinstance(item, StreamOp) and item.kind == FREE for item in s.timeline)


def test_a_plan_whose_blocks_and_residency_disagree_is_refused() -> None:
    program = mlp()
    plan = plan_keeping(program, resident_blocks=0)
    hand_edited = evolve(plan, residency={**plan.residency, "w0": RESIDENT})
    with pytest.raises(BackendError, match="streams 8 parameters in its blocks but marks 7 streamed"):
        stream_schedule(program, hand_edited)
    with pytest.raises(PlanError, match="residency marks 7 streamed"):
        check_plan(hand_edited, program)


class _Event:
    def __init__(self, disable_timing: bool = False) -> None:
        self.recorded = 0  # records enqueued so far
        self.done = 0  # records executed so far

    def record(self, stream: _Stream) -> None:
        self.recorded += 1
        stream.ops.append(("record", self, self.recorded))


class _Stream:
    """An in-order queue of operations, run later by `_drain` (a wait blocks until its record ran)."""

    registry: dict[int, _Stream] = {}

    def __init__(self, non_blocking: bool = False) -> None:
        self.ops: deque[tuple[Any, ...]] = deque()
        self.ptr = 1000 + len(_Stream.registry)
        _Stream.registry[self.ptr] = self

    def wait_event(self, event: _Event) -> None:
        self.ops.append(("wait", event, event.recorded))

    def runnable(self) -> bool:
        if not self.ops:
            return False
        op = self.ops[0]
        return op[0] != "wait" or op[1].done >= op[2]

    def run_one(self) -> None:
        op = self.ops.popleft()
        if op[0] == "record":
            op[1].done = max(op[1].done, op[2])
        elif op[0] == "copy":
            ctypes.memmove(op[1], op[2], op[3])
        elif op[0] == "check":
            op[1]()


def _memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    _Stream.registry[stream].ops.append(("copy", dst, src, size))


def _drain(main: _Stream, side: _Stream, order: str, rng: np.random.Generator) -> None:
    """Run both queues to the end: the side stream as late as possible ('lazy', so a missing wait
    reads stale bytes), as early as possible ('eager', so a missing release overwrites a slot in use),
    or at random."""
    while main.ops or side.ops:
        ready = [s for s in (main, side) if s.runnable()]
        assert ready, "the streams wait for each other: deadlock"
        if order == "random":
            pick = ready[int(rng.integers(len(ready)))]
        else:
            first, second = (main, side) if order == "lazy" else (side, main)
            pick = first if first in ready else second
        pick.run_one()


@pytest.mark.parametrize("order", ["lazy", "eager", "random"])
@pytest.mark.parametrize("case", ["alternating", "kept-slot", "three-slots"])
def test_the_streamer_has_every_block_in_place_when_it_is_read(
    monkeypatch: pytest.MonkeyPatch, case: str, order: str
) -> None:
    """WeightStreamer on a fake cupy whose two streams run in order and honour events only: whatever
    the interleaving, every node reads its streamed weights' own bytes, in two runs back to back."""
    from dif_backend_cuda import streaming

    if case == "three-slots":
        program = overlapping()
        base = plan_program(program, PROFILE, RuntimeBudget(free_memory_bytes=1 << 40))
        plan = restream(base, program, [(f"block blk{i}", [f"w{i}"]) for i in range(3)])
    else:
        program = mlp(reuse_first_at=2 if case == "kept-slot" else None)
        plan = plan_keeping(program, resident_blocks=0)
    cuda = types.SimpleNamespace(Stream=_Stream, Event=_Event, runtime=types.SimpleNamespace(memcpyAsync=_memcpy_async))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    _Stream.registry.clear()
    sched = stream_schedule(program, plan)
    weights = _weights(program)
    pinned = np.zeros(sched.pinned_bytes, np.uint8)
    placed = sched.placements()
    fill_pinned(pinned, [(host, weights[name]) for name, (_dev, host) in placed.items()])
    staging = np.full(sched.staging_bytes, 0xAB, np.uint8)
    streamer = streaming.WeightStreamer(sched, staging.ctypes.data, pinned.ctypes.data)
    main = _Stream()
    reads: list[int] = []

    def check(pos: int) -> None:
        node = program.node_by_id[plan.schedule[pos]]
        for name in node.operands:
            if name in placed:
                dev = placed[name][0]
                want = weights[name].reshape(-1).view(np.uint8)
                assert np.array_equal(staging[dev : dev + want.size], want), f"step {pos} reads stale '{name}'"
        reads.append(pos)

    for _run in range(2):
        for item in sched.timeline:
            if isinstance(item, StreamOp):
                streamer.step(item)(main)
            else:
                main.ops.append(("check", lambda pos=item: check(pos)))
    _drain(main, streamer.side, order, np.random.default_rng(11))  # type: ignore[arg-type]
    assert reads == list(range(len(plan.schedule))) * 2


def test_fill_pinned_lays_arrays_out_at_their_offsets() -> None:
    pinned = np.zeros(32, np.uint8)
    fill_pinned(pinned, [(4, np.arange(3, dtype=np.uint8)), (16, np.array([1.0], np.float32))])
    assert pinned[4:7].tolist() == [0, 1, 2] and pinned[16:20].view(np.float32)[0] == 1.0
    assert not pinned[:4].any() and not pinned[7:16].any()


# -- on the GPU -----------------------------------------------------------------------------------------


_BACKENDS: dict[bool, Any] = {}


def _backend(graph: bool) -> Any:
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    if graph not in _BACKENDS:
        from dif_backend_cuda.device import CudaBackend

        _BACKENDS[graph] = CudaBackend(graph=graph)
    return _BACKENDS[graph]


def _weights(program: Program) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {p.name: (rng.standard_normal(p.type.shape) / 8).astype(np.float32) for p in program.params}


@pytest.mark.cuda
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
def test_streamed_weights_give_the_resident_result_bit_for_bit(graph: bool) -> None:
    backend = _backend(graph)
    program = mlp(blocks=4)
    weights = _weights(program)
    profile = backend.profile()
    resident = backend.prepare(program, plan_program(program, profile, backend.budget()), weights)
    streamed_plan = plan_keeping(program, resident_blocks=1, profile=profile)
    assert len(streamed_plan.streamed) == 6
    streamed = backend.prepare(program, streamed_plan, weights)
    if graph:
        assert streamed.graph is not None, streamed.graph_error
    kinds = [s.kind for s in streamed.steps]
    assert kinds.count("stream-copy") == 3 and kinds.count("stream-wait") == 3
    assert kinds[0] == "stream-fork" and kinds[-1] == "stream-join"
    t = streamed.timings
    assert (t["streamed_blocks"], t["streamed_params"], t["streamed_bytes"]) == (3, 6, 3 * BLOCK_BYTES)
    assert t["pinned_bytes"] == 3 * BLOCK_BYTES and t["staging_bytes"] == 2 * BLOCK_BYTES
    assert t["resident_bytes"] == BLOCK_BYTES and "streamed" in streamed.describe()
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((8, WIDTH)).astype(np.float32) for _ in range(3)]
    out = program.outputs[0]
    want = [resident.run({"x": x})[out] for x in xs]
    for _ in range(2):  # a second round: slots hold the last blocks of the previous run when it starts
        got = [streamed.run({"x": x})[out] for x in xs]
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(want[0], want[1])


@pytest.mark.cuda
def test_profile_times_the_stream_steps_under_their_kind() -> None:
    backend = _backend(True)
    program = mlp(blocks=4)
    exe = backend.prepare(program, plan_keeping(program, 0, profile=backend.profile()), _weights(program))
    prof = exe.profile(iters=1)
    assert prof["stream-wait"]["steps"] == 4 and prof["stream-copy"]["steps"] == 4 and prof["linear"]["steps"] >= 4
    by_shape = exe.profile(iters=1, by="shape")
    linear = {k: v for k, v in by_shape.items() if k.startswith("linear ")}
    assert sum(v["steps"] for v in linear.values()) == prof["linear"]["steps"]
    types = program.types
    first = next(n for n in program.nodes if n.op == "linear")
    shape = "x".join(map(str, types[first.operands[0]].shape))
    assert any(k.startswith(f"linear {shape},") and "[" in k for k in linear), linear
    by_step = exe.profile(iters=1, by="step")  # each lowering's steps by kernel name or kind
    steps = {k: v for k, v in by_step.items() if k.startswith("linear: ")}
    assert sum(v["steps"] for v in steps.values()) == prof["linear"]["steps"], by_step


@pytest.mark.cuda
def test_a_block_keeping_its_slot_gives_the_resident_result_bit_for_bit() -> None:
    backend = _backend(True)
    program = mlp(reuse_first_at=2)
    weights = _weights(program)
    profile = backend.profile()
    resident = backend.prepare(program, plan_program(program, profile, backend.budget()), weights)
    plan = plan_keeping(program, 0, profile=profile)
    assert [b.slot for b in plan.streaming.blocks] == [0, 1, 1, 1]
    streamed = backend.prepare(program, plan, weights)
    assert streamed.graph is not None, streamed.graph_error
    x = np.random.default_rng(5).standard_normal((8, WIDTH)).astype(np.float32)
    out = program.outputs[0]
    want = resident.run({"x": x})[out]
    for _ in range(2):
        np.testing.assert_array_equal(streamed.run({"x": x})[out], want)


@pytest.mark.cuda
def test_refused_before_anything_is_allocated() -> None:
    backend = _backend(True)
    program = mlp()
    plan = plan_keeping(program, 0, profile=backend.profile())
    hand_edited = evolve(plan, residency={**plan.residency, "w0": RESIDENT})
    with pytest.raises(PlanError, match="residency marks"):
        backend.prepare(program, hand_edited, _weights(program))
