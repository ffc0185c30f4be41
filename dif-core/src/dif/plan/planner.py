"""Planner v1: DiffIR program + TargetProfile + RuntimeBudget -> Plan (after the optimizer, before a
backend's `prepare`).

Steps, each recorded as a `Decision`: keep the program's (topological) order as the schedule;
compute each intermediate's lifetime; place reshape/split results and concat operands as views inside
another value's bytes where the target's executor addresses them (`dif.plan.views`);
pack lifetimes into one arena (greedy by size, best-fit gap); decide weight residency against the
budget, streaming the weight blocks that move the fewest bytes when everything does not fit, and lay
the streamed blocks out in staging slots (`dif.plan.streaming`); place tiny host-known nodes on the
host where the target declares a `host_threshold_bytes` (`dif.plan.placement`). Inputs and parameters
never live in the arena. The optimizer's decisions, when given, come first in the plan.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from attrs import evolve

from dif.errors import PlanError
from dif.fingerprint import fingerprint
from dif.ir.program import Program
from dif.plan.placement import DEVICE, HOST, place_nodes
from dif.plan.plan import (
    ALIAS_CAPABILITY,
    ALIGNMENT,
    RESIDENT,
    STREAMED,
    Binding,
    Buffer,
    Decision,
    Plan,
    align_up,
    compiler_revision,
    live_bytes,
)
from dif.plan.streaming import Streaming, layout, span, streamable
from dif.plan.views import VIEW_OPS, plan_views
from dif.target import RuntimeBudget, TargetProfile


def plan_program(
    program: Program,
    profile: TargetProfile,
    budget: RuntimeBudget,
    *,
    precision: str = "as-built",
    alignment: int = ALIGNMENT,
    alias: bool | None = None,
    decisions: Sequence[Decision] = (),
) -> Plan:
    """Plan `program` for the target `profile` within `budget`.

    `alias`: let reshape results share their operand's bytes; None decides from the profile
    (`alias:reshape` in its capabilities). `decisions` (e.g. the optimizer's) are recorded first,
    after those made while the program was built (`recorded_decisions`: e.g. its LoRA mode).
    Raises `PlanError` when even streaming every weight block leaves the minimum memory above
    `budget.free_memory_bytes - budget.workspace_bytes`.
    """
    decisions = [*recorded_decisions(program), *decisions]
    schedule = tuple(n.id for n in program.nodes)
    decisions.append(
        Decision(f"schedule: program order, {len(schedule)} nodes", "program order is topological; v1 does not reorder")
    )
    if alias is None:
        alias = ALIAS_CAPABILITY in profile.capabilities
    unplaced = lifetimes(program, schedule, alignment)
    if alias:
        unplaced = plan_views(program, unplaced, {*profile.capabilities, ALIAS_CAPABILITY})
    decisions.append(_alias_decision(program, unplaced, alias, profile))
    buffers = place_aliases(assign_arena([b for b in unplaced if not b.is_alias], alignment), unplaced)
    arena = max((b.offset + b.size for b in buffers), default=0)
    peak = int(live_bytes(buffers, len(schedule)).max(initial=0))
    decisions.append(
        Decision(
            f"arena: {len(buffers)} buffers in {arena} B (peak live {peak} B, {alignment}-byte slots)",
            "greedy by size with best-fit gaps over lifetime intervals; outputs live to the end, "
            "inputs and parameters stay outside the arena",
        )
    )
    residency, chosen, admission = decide_residency(program, arena, budget)
    resident = sum(p.type.nbytes for p in program.params if residency[p.name] == RESIDENT)
    streamed = len(program.params) - sum(1 for r in residency.values() if r == RESIDENT)
    decisions.append(Decision(f"residency: {streamed} of {len(program.params)} parameters streamed", admission))
    streaming = layout(program, schedule, chosen)
    staging = streaming.staging_bytes
    decisions += _streaming_decisions(program, streaming, arena + resident, budget)
    placed = place_nodes(program, schedule, profile.host_threshold_bytes)
    decisions += _placement_decisions(program, schedule, placed.placement, placed.host_reasons, profile)
    decisions.append(Decision(f"precision: {precision}", "precision policy requested by the caller"))
    binding = Binding(
        compiler_revision=compiler_revision(),
        target_fingerprint=profile.fingerprint(),
        target_backend=profile.backend,
        target_profile=profile,
        budget_class=budget.budget_class,
        min_memory_bytes=arena + resident + staging,
    )
    return Plan(
        program_name=program.name,
        program_fingerprint=fingerprint(program),
        schedule=schedule,
        buffers=tuple(sorted(buffers, key=lambda b: (b.first_use, b.name))),
        arena_bytes=arena,
        peak_bytes=peak,
        param_bytes=program.param_bytes(),
        residency=residency,
        resident_bytes=resident,
        staging_bytes=staging,
        precision=precision,
        binding=binding,
        decisions=tuple(decisions),
        streaming=streaming,
        placement=placed.placement,
        alignment=alignment,
    )


def recorded_decisions(program: Program) -> list[Decision]:
    """The decisions made while `program` was built, from `meta["decisions"]` (a JSON list of
    [what, why] pairs, e.g. `dif.lora.LoraMode.record`); none when absent or not such a list."""
    try:
        pairs = json.loads(program.meta.get("decisions", "[]"))
    except ValueError:
        return []
    if not isinstance(pairs, list):
        return []
    return [Decision(str(p[0]), str(p[1])) for p in pairs if isinstance(p, list) and len(p) == 2]


def _streaming_decisions(program: Program, s: Streaming, fixed: int, budget: RuntimeBudget) -> list[Decision]:
    """The layout of the streamed blocks, as decisions; `PlanError` when blocks read out of order need
    more staging slots than the budget holds."""
    if not s.blocks:
        return []
    available = budget.free_memory_bytes - budget.workspace_bytes
    if fixed + s.staging_bytes > available:
        crowded = max(s.blocks, key=lambda b: (b.slot, -b.first_use))
        raise PlanError(
            f"program '{program.name}' does not fit: its streamed weight blocks are read out of order and need "
            f"{s.slots} staging slots ({s.staging_bytes} B; '{crowded.key}' opens slot {crowded.slot} at step "
            f"{crowded.first_use} while every other slot still holds a block read later), so arena + resident "
            f"{fixed} + staging {s.staging_bytes} B > available {available} B",
            hint="plan with a larger budget so one of these blocks stays resident, or give the frontend's weights "
            "provenance blocks that are used one after another",
        )
    extra = (
        f"; blocks read out of order need {s.slots} slots, not the 2 the admission assumed: staging "
        f"{s.staging_bytes} B, arena + resident + staging {fixed + s.staging_bytes} B <= available {available} B"
        if s.slots > 2
        else ""
    )
    return [
        Decision(
            f"streaming: {len(s.blocks)} blocks through {s.slots} staging slots of {s.slot_bytes} B",
            "blocks are copied in first-use order, each into the slot released earliest (its previous tenant's "
            "last reader ran before the block's first); parameters start on 256-byte boundaries in their slot; a "
            "block must have arrived before its first reader and frees its slot after its last (dif.plan.streaming)"
            + extra,
        )
    ]


def _placement_decisions(
    program: Program,
    schedule: tuple[int, ...],
    placement: tuple[str, ...],
    reasons: dict[int, str],
    profile: TargetProfile,
) -> list[Decision]:
    threshold = profile.host_threshold_bytes
    if not threshold:
        return [
            Decision(
                f"placement: all {len(schedule)} nodes on the device",
                f"target '{profile.backend}' declares no host_threshold_bytes",
            )
        ]
    nodes = program.node_by_id
    hosted = [n for n, where in zip(schedule, placement, strict=True) if where == HOST]
    out = [
        Decision(
            f"placement: {len(hosted)} of {len(schedule)} nodes on the host, {placement.count(DEVICE)} on the device",
            f"target '{profile.backend}' measured the host faster for nodes touching at most {threshold} B "
            "(host_threshold_bytes); such a node runs on the host when it reads only inputs, weights and host "
            "results, every other node on the device",
        )
    ]
    out += [Decision(f"placement: node {n} ({nodes[n].op}) on the host", reasons[n]) for n in hosted]
    return out


def lifetimes(program: Program, schedule: tuple[int, ...], alignment: int = ALIGNMENT) -> list[Buffer]:
    """Unplaced buffers (offset 0) for every node result: produced at its node's schedule index,
    alive through its last consumer; program outputs through the last step."""
    position = {node_id: i for i, node_id in enumerate(schedule)}
    end = len(schedule) - 1
    outputs = set(program.outputs)
    users = program.users
    out: list[Buffer] = []
    for node_id in schedule:
        node = program.node_by_id[node_id]
        first = position[node_id]
        for value in node.results:
            last = max((position[u.id] for u in users.get(value.name, ())), default=first)
            if value.name in outputs:
                last = end
            nbytes = value.type.nbytes
            out.append(Buffer(value.name, nbytes, align_up(nbytes, alignment), 0, first, last))
    return out


def place_aliases(placed: list[Buffer], buffers: list[Buffer]) -> list[Buffer]:
    """Every buffer of `buffers` with its offset: roots as `placed` put them, views at their offset
    into their root's slot."""
    offsets = {b.name: b for b in placed}
    return [
        evolve(b, offset=offsets[b.alias_of].offset + b.offset) if b.alias_of is not None else offsets[b.name]
        for b in buffers
    ]


def _alias_decision(program: Program, buffers: list[Buffer], alias: bool, profile: TargetProfile) -> Decision:
    if not alias:
        return Decision(
            "views: off, every value gets its own slot",
            f"target '{profile.backend}' does not declare '{ALIAS_CAPABILITY}' (its executor copies reshapes)",
        )
    kinds: dict[str, int] = {}
    producers = program.producers
    for b in buffers:
        if b.is_alias:
            op = producers[b.name].op
            kind = op if op in VIEW_OPS else "concat operand"
            kind += " (pitched)" if b.pitch_bytes else ""
            kinds[kind] = kinds.get(kind, 0) + 1
    saved = sum(b.size for b in buffers if b.is_alias)
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
    return Decision(
        f"views: {counts} placed inside another value's bytes ({saved} B of slots and their copies saved)",
        "reshape and split results are (parts of) their operand, concat operands are written into their part "
        "of the result; roots live as long as their views; the target's capabilities say which views its "
        "executor addresses (dif.plan.views)",
    )


def assign_arena(buffers: list[Buffer], alignment: int = ALIGNMENT) -> list[Buffer]:
    """Give each buffer an offset so that buffers alive at the same time never share a byte.

    Largest first; each goes into the smallest gap between already-placed, time-overlapping
    buffers that holds it (best fit), else on top of them. Offsets stay multiples of `alignment`
    because every size is.
    """
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first_use, buffers[i].name))
    first = np.array([b.first_use for b in buffers], dtype=np.int64)
    last = np.array([b.last_use for b in buffers], dtype=np.int64)
    lo = np.zeros(len(buffers), dtype=np.int64)
    hi = np.zeros(len(buffers), dtype=np.int64)
    placed = np.zeros(len(buffers), dtype=bool)
    for i in order:
        size = buffers[i].size
        if size:
            live = placed & (first <= last[i]) & (first[i] <= last) & (hi > lo)
            lo[i] = _best_fit(lo[live], hi[live], size)
            hi[i] = lo[i] + size
        placed[i] = True
    return [evolve(b, offset=int(lo[i])) for i, b in enumerate(buffers)]


def _best_fit(starts: np.ndarray, ends: np.ndarray, size: int) -> int:
    """Lowest offset of the smallest free gap of at least `size` among occupied [start, end)."""
    best, best_gap = -1, -1
    cursor = 0
    for k in np.argsort(starts, kind="stable"):
        start, end = int(starts[k]), int(ends[k])
        gap = start - cursor
        if gap >= size and (best_gap < 0 or gap < best_gap):
            best, best_gap = cursor, gap
        cursor = max(cursor, end)
    return best if best >= 0 else cursor


def weight_blocks(program: Program) -> dict[str, list[str]]:
    """Streamable parameters (`dif.plan.streaming.streamable`) grouped into streaming blocks: the
    provenance block of their first user (as the frontend declared it), else the parameter alone.
    Blocks are streamed whole; the other parameters are always resident."""
    users = program.users
    ok = streamable(program)
    blocks: dict[str, list[str]] = {}
    for p in program.params:
        if p.name not in ok:
            continue
        first_user = users.get(p.name, ())
        prov = program.provenance.get(first_user[0].id) if first_user else None
        key = f"block {prov.block}" if prov is not None and prov.block else f"param {p.name}"
        blocks.setdefault(key, []).append(p.name)
    return blocks


def decide_residency(
    program: Program, arena: int, budget: RuntimeBudget
) -> tuple[dict[str, str], list[tuple[str, list[str]]], str]:
    """(residency by parameter, the streamed blocks as (key, parameter names), admission arithmetic as text).

    Everything is resident if arena + weights fit the budget. Otherwise whole weight blocks are streamed:
    staging holds two of the largest streamed block (one in use, one being prefetched), so streaming one
    big block costs its staging as well. For every bound on the streamed block size, the blocks within it
    are streamed largest first until arena + resident + staging fits; the bound that streams the fewest
    bytes per forward wins (then the smaller staging). A model whose largest block is an outlier (an
    embedding) thus keeps it resident when streaming the others suffices.
    """
    available = budget.free_memory_bytes - budget.workspace_bytes
    sizes = {p.name: p.type.nbytes for p in program.params}
    total = sum(sizes.values())
    head = f"available {available} B (free {budget.free_memory_bytes} - workspace {budget.workspace_bytes})"
    if arena + total <= available:
        return {name: RESIDENT for name in sizes}, [], f"arena {arena} + weights {total} = {arena + total} B <= {head}"
    # (bytes, staged bytes: each parameter starting on an aligned address in a staging slot, key, names)
    blocks = sorted(
        ((sum(sizes[n] for n in names), span(program, names), key, names)
         for key, names in weight_blocks(program).items()),
        key=lambda b: (-b[0], b[2]),
    )  # fmt: skip
    best: tuple[int, int, list[tuple[str, list[str]]]] | None = None  # (streamed bytes, staging, blocks)
    for bound in sorted({b[1] for b in blocks}):
        resident, staging, chosen = total, 0, []
        for nbytes, staged, key, names in blocks:
            if arena + resident + staging <= available:
                break
            if staged <= bound:
                resident, staging = resident - nbytes, max(staging, 2 * staged)
                chosen.append((key, names))
        if arena + resident + staging <= available and (best is None or (total - resident, staging) < best[:2]):
            best = (total - resident, staging, chosen)
    if best is not None:
        streamed, staging, chosen = best
        residency = {name: RESIDENT for name in sizes}
        residency.update((n, STREAMED) for _key, names in chosen for n in names)
        need = arena + (total - streamed) + staging
        why = (
            f"arena {arena} + weights {total} = {arena + total} B > {head}; streamed {len(chosen)} of "
            f"{len(blocks)} weight blocks ({streamed} B per forward, the fewest bytes of any bound on the "
            f"streamed block size): arena {arena} + resident {total - streamed} + staging {staging} "
            f"(2 x largest streamed block) = {need} B <= available"
        )
        return residency, chosen, why
    staging = 2 * max((b[1] for b in blocks), default=0)
    fixed = total - sum(b[0] for b in blocks)  # parameters no node reads, or outputs: never streamed
    need = arena + fixed + staging
    raise PlanError(
        f"program '{program.name}' does not fit: even streaming all weights needs arena {arena} + unstreamable "
        f"weights {fixed} + staging {staging} = {need} B, but only {head}",
        hint="free device memory, use a smaller resolution/batch, or a lower-precision weight format",
    )


def restream(plan: Plan, program: Program, blocks: list[tuple[str, list[str]]]) -> Plan:
    """`plan` with exactly `blocks` ((key, parameter names)) streamed and every other weight resident,
    laid out as the planner lays blocks out, figures and binding minimum to match; checked against
    `program`. For tests and tools that pin the streaming by hand (no budget arithmetic)."""
    from dif.plan.plan import check_plan

    streaming = layout(program, plan.schedule, blocks)
    residency = {name: RESIDENT for name in plan.residency}
    residency.update((name, STREAMED) for _key, names in blocks for name in names)
    resident = sum(p.type.nbytes for p in program.params if residency[p.name] == RESIDENT)
    staging = streaming.staging_bytes
    out = evolve(
        plan,
        residency=residency,
        streaming=streaming,
        staging_bytes=staging,
        resident_bytes=resident,
        binding=evolve(plan.binding, min_memory_bytes=plan.arena_bytes + resident + staging),
    )
    check_plan(out, program)
    return out
