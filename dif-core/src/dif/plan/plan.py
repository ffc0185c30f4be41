"""The Plan: what the planner decided for one program on one target (sits between the optimizer and a
backend's `prepare`).

A plan fixes the execution order, where every intermediate value lives in one byte arena, which
weights stay resident and how the others stream (`dif.plan.streaming`), which nodes run on the host
(`dif.plan.placement`), and what it is bound to (program, compiler, target, budget, precision). A
backend executes these decisions and re-derives none of them. It is plain data: frozen attrs
classes that cattrs turns into JSON-able dicts for `.difplan`.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

import cattrs
import numpy as np
from attrs import frozen

import dif
from dif.errors import PlanError
from dif.plan.placement import DEVICE, check_placement
from dif.plan.streaming import Streaming, check_streaming, check_streaming_fits
from dif.target import TargetProfile

if TYPE_CHECKING:
    from dif.ir.program import Program

PLAN_FORMAT_REV = 4
"""Bumped whenever the meaning of a plan field changes; part of the compiler revision.
Rev 2: buffers may alias another buffer's bytes (`Buffer.alias_of`).
Rev 3: an alias may sit anywhere inside its root, contiguous or as pitched rows (`dif.plan.views`).
Rev 4: the plan records the weight-streaming schedule (`Plan.streaming`) and each node's placement."""

ALIGNMENT = 256
"""Every buffer starts on and spans a multiple of this many bytes (GPU-friendly; harmless on CPU)."""
VIEW_ALIGNMENT = 16
"""Views inside another buffer start on (and pitched rows step by) a multiple of this many bytes."""

MAX_BYTES = 1 << 60
"""Sanity bound on any byte figure in a plan (keeps hostile files away from int64 overflow)."""

RESIDENT = "resident"
STREAMED = "streamed"
RESIDENCIES = (RESIDENT, STREAMED)

ALIAS_CAPABILITY = "alias:reshape"
"""Listed in `TargetProfile.capabilities` by a backend whose executor reads a `reshape` result that
aliases its operand from the operand's bytes (and does not copy it); the planner aliases only then.
`dif.plan.views` has the capabilities of the other views."""


def compiler_revision() -> str:
    """The revision a plan made by this dif is bound to: package version + plan format rev."""
    return f"{dif.__version__}+plan{PLAN_FORMAT_REV}"


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


@frozen
class Buffer:
    """Arena slot of one intermediate value.

    `first_use` / `last_use` are schedule indices (not node ids), inclusive: the value is written by
    the node at `first_use` and must stay intact through the node at `last_use`. `size` is `nbytes`
    rounded up to the plan's alignment; `[offset, offset + size)` is the slot.

    `alias_of` names the root buffer whose bytes this value is a view of (`dif.plan.views`: a reshape
    or split result inside its operand, a concat operand inside the concat's result): it owns no bytes,
    sits inside the root's slot, and the root's lifetime covers its own. Chains point at the root.
    A view is contiguous from `offset`, or, when `pitch_bytes` is set, rows of `row_bytes` whose
    starts are `pitch_bytes` apart.
    """

    name: str
    nbytes: int
    size: int
    offset: int
    first_use: int
    last_use: int
    alias_of: str | None = None
    row_bytes: int = 0
    pitch_bytes: int = 0

    @property
    def is_alias(self) -> bool:
        return self.alias_of is not None

    @property
    def extent(self) -> int:
        """Bytes from `offset` to the end of the view's last byte."""
        if not self.pitch_bytes or not self.nbytes:
            return self.nbytes
        return (self.nbytes // self.row_bytes - 1) * self.pitch_bytes + self.row_bytes


@frozen
class Decision:
    """One planner decision, with the reason a reader (or `dif plan`) is shown."""

    what: str
    why: str


@frozen
class Binding:
    """What a plan is only valid for; `dif.plan.difplan.check_binding` compares it on replay.

    `budget_class` is informational (plans are reusable across budget classes as long as
    `min_memory_bytes` fits); `target_profile` is kept so a mismatch can say which fields changed.
    """

    compiler_revision: str
    target_fingerprint: str
    target_backend: str
    target_profile: TargetProfile
    budget_class: str
    min_memory_bytes: int


@frozen(eq=True, hash=False)
class Plan:
    """A program's execution plan on one target.

    Memory figures are bytes. `peak_bytes` is the most arena bytes live at any schedule step (a
    lower bound for `arena_bytes`; the gap is packing fragmentation). `min_memory_bytes` in the
    binding is arena + resident weights + streaming staging (`streaming.staging_bytes`).
    `placement[i]` says where the node at schedule step i runs ("device" or "host").
    """

    program_name: str
    program_fingerprint: str
    schedule: tuple[int, ...]
    buffers: tuple[Buffer, ...]
    arena_bytes: int
    peak_bytes: int
    param_bytes: int
    residency: dict[str, str]
    resident_bytes: int
    staging_bytes: int
    precision: str
    binding: Binding
    decisions: tuple[Decision, ...]
    streaming: Streaming
    placement: tuple[str, ...]
    alignment: int = ALIGNMENT

    @cached_property
    def buffer_by_name(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    @property
    def streamed(self) -> tuple[str, ...]:
        return tuple(name for name, r in self.residency.items() if r == STREAMED)

    @property
    def host_nodes(self) -> tuple[int, ...]:
        """Ids of the nodes placed on the host, in schedule order."""
        return tuple(n for n, where in zip(self.schedule, self.placement, strict=True) if where != DEVICE)

    def describe(self) -> str:
        """A short human summary (used by `dif plan` and in error messages)."""
        lines = [
            f"plan for '{self.program_name}' ({self.program_fingerprint}) on {self.binding.target_backend}",
            f"  nodes {len(self.schedule)}, buffers {len(self.buffers)}, arena {self.arena_bytes} B, "
            f"peak {self.peak_bytes} B, params {self.param_bytes} B "
            f"({len(self.streamed)} streamed in {len(self.streaming.blocks)} blocks, {self.streaming.slots} staging "
            f"slots), {len(self.host_nodes)} nodes on the host, min memory {self.binding.min_memory_bytes} B",
            f"  precision {self.precision}, compiler {self.binding.compiler_revision}",
        ]
        lines += [f"  - {d.what}: {d.why}" for d in self.decisions]
        return "\n".join(lines)


def live_bytes(buffers: tuple[Buffer, ...] | list[Buffer], steps: int) -> np.ndarray:
    """Arena bytes live at each of `steps` schedule steps (slot sizes, alignment included; aliases
    own no bytes)."""
    delta = np.zeros(steps + 1, dtype=np.int64)
    for b in buffers:
        if b.is_alias:
            continue
        delta[b.first_use] += b.size
        delta[b.last_use + 1] -= b.size
    return np.cumsum(delta[:steps])


def check_arena(plan: Plan) -> None:
    """Raise `PlanError` unless every buffer is aligned, inside the arena, and no two buffers that are
    alive at the same schedule step share a byte, except an alias and its root: an alias must name a
    root buffer (not another alias), sit at the root's offset within its size, and live inside the
    root's lifetime. Also checks `peak_bytes` against the lifetimes.

    This is the invariant a backend relies on when it writes results at planned offsets: if it
    fails, executing the plan would silently corrupt values.
    """
    steps = len(plan.schedule)
    if plan.alignment <= 0:
        raise PlanError(f"plan alignment must be positive, got {plan.alignment}")
    if not 0 <= plan.arena_bytes <= MAX_BYTES:
        raise PlanError(f"arena size {plan.arena_bytes} is out of range")
    seen: set[str] = set()
    for b in plan.buffers:
        where = f"buffer '{b.name}'"
        if b.name in seen:
            raise PlanError(f"{where} appears twice in the plan")
        seen.add(b.name)
        if not 0 <= b.offset <= MAX_BYTES or not 0 <= b.size <= MAX_BYTES:
            raise PlanError(f"{where}: offset {b.offset} / size {b.size} out of range")
        if b.nbytes < 0 or b.size < b.nbytes or b.size % plan.alignment:
            raise PlanError(f"{where}: size {b.size} does not hold {b.nbytes} bytes in {plan.alignment}-byte units")
        if b.offset < 0 or b.offset % (VIEW_ALIGNMENT if b.is_alias else plan.alignment):
            raise PlanError(f"{where}: offset {b.offset} is not a multiple of {plan.alignment}")
        if (
            b.row_bytes < 0
            or b.pitch_bytes < 0
            or bool(b.pitch_bytes)
            and not (b.is_alias and 0 < b.row_bytes < b.pitch_bytes and b.nbytes % b.row_bytes == 0)
        ):
            raise PlanError(f"{where}: rows of {b.row_bytes} B every {b.pitch_bytes} B do not describe a view")
        if b.offset + b.size > plan.arena_bytes:
            raise PlanError(f"{where}: [{b.offset}, {b.offset + b.size}) runs past the arena ({plan.arena_bytes} B)")
        if not 0 <= b.first_use <= b.last_use < max(steps, 1):
            raise PlanError(f"{where}: lifetime [{b.first_use}, {b.last_use}] is not inside the {steps}-step schedule")
    _check_aliases(plan)
    roots = [b for b in plan.buffers if not b.is_alias]
    n = len(roots)
    first = np.array([b.first_use for b in roots], dtype=np.int64)
    last = np.array([b.last_use for b in roots], dtype=np.int64)
    lo = np.array([b.offset for b in roots], dtype=np.int64)
    hi = lo + np.array([b.size for b in roots], dtype=np.int64)
    for i in range(n - 1):
        if hi[i] == lo[i]:
            continue
        clash = (
            (first[i + 1 :] <= last[i]) & (first[i] <= last[i + 1 :]) & (lo[i + 1 :] < hi[i]) & (lo[i] < hi[i + 1 :])
        )
        if clash.any():
            a, b = roots[i], roots[i + 1 + int(np.argmax(clash))]
            raise PlanError(
                f"buffers '{a.name}' [{a.offset}, {a.offset + a.size}) alive {a.first_use}..{a.last_use} and "
                f"'{b.name}' [{b.offset}, {b.offset + b.size}) alive {b.first_use}..{b.last_use} overlap",
                hint="the arena assignment is wrong; re-plan the program",
            )
    peak = int(live_bytes(plan.buffers, steps).max(initial=0))
    if peak != plan.peak_bytes:
        raise PlanError(f"plan states peak {plan.peak_bytes} B but its lifetimes give {peak} B")
    if plan.peak_bytes > plan.arena_bytes:
        raise PlanError(f"peak {plan.peak_bytes} B exceeds the arena ({plan.arena_bytes} B)")


def _check_aliases(plan: Plan) -> None:
    by_name = plan.buffer_by_name
    for b in plan.buffers:
        if b.alias_of is None:
            continue
        where = f"buffer '{b.name}' (alias of '{b.alias_of}')"
        root = by_name.get(b.alias_of)
        if root is None or root.is_alias or root.name == b.name:
            raise PlanError(f"{where}: the root must be another buffer of the plan that is not itself an alias")
        if b.offset < root.offset or b.offset + b.extent > root.offset + root.nbytes:
            raise PlanError(
                f"{where}: [{b.offset}, +{b.extent}) is not inside the root's bytes [{root.offset}, +{root.nbytes})"
            )
        if not root.first_use <= b.first_use <= b.last_use <= root.last_use:
            raise PlanError(
                f"{where}: lifetime {b.first_use}..{b.last_use} is not inside the root's "
                f"{root.first_use}..{root.last_use}",
                hint="the root must stay intact until the alias's last use; re-plan the program",
            )


def check_plan(plan: Plan, program: Program) -> None:
    """Raise `PlanError` unless `plan` fits `program`: the schedule is a topological order of its
    nodes, every node result has a buffer of the right size whose lifetime covers its producer,
    consumers and (for outputs) the end, every view is where its op puts it
    (`dif.plan.views.check_views`), and the arena is sound (`check_arena`)."""
    from dif.plan.views import check_views

    nodes = program.node_by_id
    if sorted(plan.schedule) != sorted(nodes):
        raise PlanError(f"plan schedule does not list exactly the {len(nodes)} nodes of '{program.name}'")
    position = {node_id: i for i, node_id in enumerate(plan.schedule)}
    producers = program.producers
    for i, node_id in enumerate(plan.schedule):
        for name in nodes[node_id].operands:
            if name in producers and position[producers[name].id] >= i:
                raise PlanError(f"plan schedule runs node {node_id} before the producer of its operand {name}")
    check_arena(plan)
    buffers = plan.buffer_by_name
    results = {r.name: r for n in program.nodes for r in n.results}
    if set(buffers) != set(results):
        extra = sorted(set(buffers) - set(results))[:3]
        missing = sorted(set(results) - set(buffers))[:3]
        raise PlanError(f"plan buffers do not match the program's values (missing {missing}, unknown {extra})")
    outputs = set(program.outputs)
    end = len(plan.schedule) - 1
    for name, value in results.items():
        b = buffers[name]
        if b.nbytes != value.type.nbytes:
            raise PlanError(f"buffer '{name}' has {b.nbytes} B but the value is {value.type} ({value.type.nbytes} B)")
        uses = [position[n.id] for n in program.users.get(name, ())]
        # a root hosting a concat's operands starts when the first of them is written
        if b.first_use > position[producers[name].id] or any(u > b.last_use for u in uses):
            raise PlanError(f"buffer '{name}' lifetime {b.first_use}..{b.last_use} does not cover its uses {uses}")
        if name in outputs and b.last_use != end:
            raise PlanError(f"output '{name}' must live to the end of the schedule (step {end}), not {b.last_use}")
    check_views(plan, program)
    param_names = {p.name for p in program.params}
    if set(plan.residency) != param_names:
        raise PlanError("plan residency does not list exactly the program's parameters")
    check_records(plan)
    check_streaming_fits(plan, program)
    check_placement(plan.placement, plan.schedule, program)


def check_records(plan: Plan) -> None:
    """Raise `PlanError` unless the streaming schedule and the placement are sound on their own (what a
    `.difplan` loader can check without the program)."""
    check_streaming(plan)
    check_placement(plan.placement, plan.schedule)


def _strict_int(value: Any, _type: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}"[:200])
    return value


def _strict_str(value: Any, _type: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}"[:200])
    return value


def _make_converter() -> cattrs.Converter:
    # Strict scalars: a plan read from disk must not have "12" silently become 12 or [] become "[]".
    conv = cattrs.Converter(forbid_extra_keys=True)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(str, _strict_str)
    return conv


converter = _make_converter()


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return converter.unstructure(plan)  # type: ignore[no-any-return]


def plan_from_dict(data: Any) -> Plan:
    """Structure a plan; raises `PlanError` (never a cattrs/TypeError) on a malformed document."""
    try:
        return converter.structure(data, Plan)
    except Exception as exc:  # cattrs raises ClassValidationError/TypeError/KeyError/ValueError…
        raise PlanError(f"malformed plan document: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return f"{exc.message}: {_first_line(inner)}"
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]
