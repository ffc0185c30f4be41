"""The weight-streaming schedule of a plan: which parameters move as blocks, where they sit in the
staging slots, when they must have arrived and when their slot may be reused (a planner step, after
residency; every backend that streams executes it as recorded).

Blocks are copied in first-use order. The first two open a slot each (double buffering: one block
is read while the next is copied in); every later block takes the slot whose tenant was released
earliest (its last use ran before this block's first use), so sequential blocks alternate between
two slots and a block read again later keeps its slot while the others move on; only when every
slot is still in use does another slot open. A block records the previous tenant of its slot
(`after`): its copy may start once that block's `last_use` step has run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import frozen

from dif.errors import PlanError

if TYPE_CHECKING:
    from dif.ir.program import Program
    from dif.plan.plan import Plan

DOUBLE_BUFFER = 2
"""Slots opened before any is reused, so that a copy overlaps the reads of the block before it."""
STREAM_ALIGNMENT = 256
"""Every streamed parameter starts on a multiple of this many bytes inside its slot (the arena's
alignment: GPU-friendly copies and loads)."""


@frozen
class StreamBlock:
    """Streamed parameters copied together into one staging slot.

    `params[k]` starts `offsets[k]` bytes into slot `slot`; `nbytes` is the span one copy moves (the
    last parameter's offset + its size, aligned). The block must have arrived before schedule step
    `first_use` runs (its first reader) and is read up to step `last_use`, after which the slot may
    take its next tenant. `after` indexes `Streaming.blocks`: the previous tenant of the same slot,
    whose release this block's copy waits for (-1: the slot's first tenant).
    """

    key: str
    params: tuple[str, ...]
    offsets: tuple[int, ...]
    nbytes: int
    slot: int
    first_use: int
    last_use: int
    after: int


@frozen
class Streaming:
    """`slots` staging slots of `slot_bytes` each, slot s at byte `s * slot_bytes` of one staging
    region, and the blocks in the order they are copied (first use)."""

    slots: int
    slot_bytes: int
    blocks: tuple[StreamBlock, ...]

    @property
    def staging_bytes(self) -> int:
        return self.slots * self.slot_bytes

    @property
    def streamed(self) -> tuple[str, ...]:
        return tuple(name for b in self.blocks for name in b.params)

    def offsets(self) -> dict[str, int]:
        """Byte offset of every streamed parameter from the start of the staging region."""
        return {
            name: b.slot * self.slot_bytes + off
            for b in self.blocks
            for name, off in zip(b.params, b.offsets, strict=True)
        }


NO_STREAMING = Streaming(0, 0, ())


def _align(nbytes: int) -> int:
    # an empty parameter still gets a slot of its own, so offsets stay strictly increasing
    return -(-max(nbytes, 1) // STREAM_ALIGNMENT) * STREAM_ALIGNMENT


def span(program: Program, names: list[str] | tuple[str, ...]) -> int:
    """Staging bytes of a block of `names`: each parameter starts on a `STREAM_ALIGNMENT` boundary."""
    types = program.types
    return sum(_align(types[n].nbytes) for n in names)


def read_positions(program: Program, schedule: tuple[int, ...]) -> dict[str, list[int]]:
    """Schedule positions of the nodes reading each value, in order (a node counted once)."""
    nodes = program.node_by_id
    out: dict[str, list[int]] = {}
    for pos, node_id in enumerate(schedule):
        for name in dict.fromkeys(nodes[node_id].operands):
            out.setdefault(name, []).append(pos)
    return out


def streamable(program: Program) -> set[str]:
    """Parameters that can be streamed: read by some node and not a program output (an unread one has
    no use to arrive before; an output must still be in place when the outputs are read)."""
    read = {o for n in program.nodes for o in n.operands}
    outputs = set(program.outputs)
    return {p.name for p in program.params if p.name in read and p.name not in outputs}


def layout(program: Program, schedule: tuple[int, ...], blocks: list[tuple[str, list[str]]]) -> Streaming:
    """The streaming schedule of `blocks` ((key, parameter names in program order), each streamed
    whole) over `schedule` (see the module docstring)."""
    if not blocks:
        return NO_STREAMING
    ok = streamable(program)
    for key, names in blocks:
        for name in names:
            if name not in ok:
                raise PlanError(f"'{key}': parameter '{name}' is not read by a node, or is an output: it cannot stream")
    reads = read_positions(program, schedule)
    types = program.types
    spans = sorted((min(reads[n][0] for n in names), max(reads[n][-1] for n in names), key, names)
                   for key, names in blocks)  # fmt: skip
    tenants: list[int] = []  # block index holding each slot
    out: list[StreamBlock] = []
    for i, (first, last, key, names) in enumerate(spans):
        free = [s for s, t in enumerate(tenants) if out[t].last_use < first]
        if free and len(tenants) >= DOUBLE_BUFFER:
            slot = min(free, key=lambda s: (out[tenants[s]].last_use, s))
            after = tenants[slot]
            tenants[slot] = i
        else:
            slot, after = len(tenants), -1
            tenants.append(i)
        offsets, end = [], 0
        for name in names:
            offsets.append(end)
            end += _align(types[name].nbytes)
        out.append(StreamBlock(key, tuple(names), tuple(offsets), end, slot, first, last, after))
    return Streaming(len(tenants), max(b.nbytes for b in out), tuple(out))


def check_streaming(plan: Plan) -> None:
    """Raise `PlanError` unless the plan's streaming schedule is sound on its own: blocks in first-use
    order inside the schedule, parameters at aligned, increasing offsets inside their slot, each slot's
    tenants one after another (a block is copied only once its slot's previous tenant is done), the
    streamed parameters exactly those `residency` marks streamed, and staging = slots x slot size."""
    from dif.plan.plan import MAX_BYTES, STREAMED

    s = plan.streaming
    steps = len(plan.schedule)
    if not 0 <= s.slots <= len(s.blocks) or not 0 <= s.slot_bytes <= MAX_BYTES or bool(s.slots) != bool(s.blocks):
        raise PlanError(f"streaming: {s.slots} slots of {s.slot_bytes} B for {len(s.blocks)} blocks")
    if plan.staging_bytes != s.staging_bytes:
        raise PlanError(f"staging {plan.staging_bytes} B is not {s.slots} slots x {s.slot_bytes} B")
    last_tenant: dict[int, int] = {}
    seen: set[str] = set()
    previous_first = 0
    for i, b in enumerate(s.blocks):
        where = f"streamed block {i} ('{b.key}')"
        if not b.params or len(b.offsets) != len(b.params) or len(set(b.params)) != len(b.params):
            raise PlanError(f"{where}: {len(b.params)} parameters with {len(b.offsets)} offsets")
        if seen & set(b.params):
            raise PlanError(f"{where}: parameter(s) {sorted(seen & set(b.params))} are in another block too")
        seen.update(b.params)
        if any(o < 0 or o % STREAM_ALIGNMENT for o in b.offsets) or list(b.offsets) != sorted(set(b.offsets)):
            raise PlanError(f"{where}: offsets {b.offsets} are not increasing multiples of {STREAM_ALIGNMENT}")
        if not b.offsets[-1] < b.nbytes <= s.slot_bytes or b.nbytes % STREAM_ALIGNMENT:
            raise PlanError(f"{where}: span {b.nbytes} B does not fit its offsets and the {s.slot_bytes}-byte slot")
        if not 0 <= b.slot < s.slots:
            raise PlanError(f"{where}: slot {b.slot} is not one of the {s.slots} staging slots")
        if not previous_first <= b.first_use <= b.last_use < steps:
            raise PlanError(
                f"{where}: steps {b.first_use}..{b.last_use} are not in first-use order inside the "
                f"{steps}-step schedule"
            )
        previous_first = b.first_use
        if b.after != last_tenant.get(b.slot, -1):
            raise PlanError(
                f"{where}: follows block {b.after} in slot {b.slot}, but the slot's previous tenant is "
                f"block {last_tenant.get(b.slot, -1)}"
            )
        if b.after >= 0 and s.blocks[b.after].last_use >= b.first_use:
            prev = s.blocks[b.after]
            raise PlanError(
                f"{where}: takes over slot {b.slot} at step {b.first_use} while '{prev.key}' is still read "
                f"there up to step {prev.last_use}",
                hint="re-plan the program",
            )
        last_tenant[b.slot] = i
    marked = {name for name, r in plan.residency.items() if r == STREAMED}
    if marked != seen:
        raise PlanError(
            f"streaming blocks hold {len(seen)} parameters but residency marks {len(marked)} streamed "
            f"(e.g. {sorted(marked ^ seen)[:3]})"
        )


def check_streaming_fits(plan: Plan, program: Program) -> None:
    """Raise `PlanError` unless every streamed parameter fits between its offset and the next one,
    may be streamed (`streamable`), and every node reading it runs inside its block's steps."""
    s = plan.streaming
    types = program.types
    ok = streamable(program)
    reads = read_positions(program, plan.schedule)
    for i, b in enumerate(s.blocks):
        ends = (*b.offsets[1:], b.nbytes)
        for name, off, end in zip(b.params, b.offsets, ends, strict=True):
            where = f"streamed parameter '{name}' (block {i}, '{b.key}')"
            if name not in ok:
                raise PlanError(f"{where}: not a parameter read by a node, or a program output: it cannot stream")
            if off + types[name].nbytes > end:
                raise PlanError(f"{where}: {types[name].nbytes} B at offset {off} run into the next one at {end}")
            uses = reads[name]
            if uses[0] < b.first_use or uses[-1] > b.last_use:
                raise PlanError(
                    f"{where}: read at steps {uses[0]}..{uses[-1]}, outside its block's {b.first_use}..{b.last_use}"
                )
