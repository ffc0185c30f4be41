"""The CPU stand-in for a multi-GPU run: every rank program of a `ParallelPlan` executed in this process,
segment by segment on a backend, with the all-to-alls done on the host between segments.

    run_ranks(plan, weights, feeds) -> the outputs joined across ranks (`gather`)

Ranks run one after the other; at each collective every rank's operand is exchanged at once
(`exchange_all_to_all`). It checks the transform, not speed: on one device the ranks only take turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dif.ir.program import Program
from dif.parallel.collectives import exchange_all_to_all
from dif.parallel.layout import Sharding
from dif.parallel.segments import Collective, Segment, Step, cut
from dif.parallel.ulysses import ParallelPlan
from dif.plan.plan import Plan


def gather(pieces: Sequence[np.ndarray], sharding: Sharding) -> np.ndarray:
    """Every rank's rows (padding included) -> the whole tensor, rows in global order."""
    ranks = len(pieces)
    offsets = sharding.local_offsets(ranks)
    order = sorted(range(len(sharding.blocks)), key=lambda i: sharding.blocks[i].start)
    parts = []
    for i in order:
        blk = sharding.blocks[i]
        for r in range(ranks):
            take = [slice(None)] * pieces[r].ndim
            take[sharding.axis] = slice(offsets[i], offsets[i] + blk.valid(r, ranks))
            parts.append(pieces[r][tuple(take)])
    return np.concatenate(parts, axis=sharding.axis)


def prepare_segment(
    program: Program, weights: Mapping[str, np.ndarray], backend: Any, decisions: Sequence[Any]
) -> tuple[Any, Plan]:  # type: ignore[misc]
    """One segment optimized, planned (the transform's decisions first) and prepared on `backend`."""
    from dif.passes import summarize
    from dif.plan.planner import plan_program
    from dif.runtime import optimize_for

    profile = backend.profile()
    optimized, pass_decisions = optimize_for(program, backend, profile)
    plan = plan_program(
        optimized,
        profile,
        backend.budget(),
        decisions=(*summarize(decisions, ["ulysses"], source="dif.parallel.ulysses"), *pass_decisions),
    )
    return backend.prepare(optimized, plan, {p.name: weights[p.name] for p in program.params}), plan


def run_ranks(
    plan: ParallelPlan, weights: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], *, backend: str = "cpu"
) -> tuple[dict[str, np.ndarray], list[list[Plan]]]:
    """Run every rank program of `plan` on `backend` (a name) with the same `feeds`; the outputs joined
    across ranks, and the plans of each rank's segments (their decisions start with the transform's)."""
    from dif.runtime import get_backend

    dev = get_backend(backend)
    steps: list[list[Step]] = [cut(p) for p in plan.programs]
    if len({len(s) for s in steps}) != 1:
        raise AssertionError("rank programs must have the same collectives in the same order")
    envs: list[dict[str, np.ndarray]] = [dict(feeds) for _ in plan.programs]
    plans: list[list[Plan]] = [[] for _ in plan.programs]
    for k in range(len(steps[0])):
        if isinstance(steps[0][k], Collective):
            collectives = [s[k] for s in steps]
            assert all(isinstance(c, Collective) for c in collectives)
            nodes = [c.node for c in collectives]  # type: ignore[union-attr]
            split, concat = steps[0][k].axes  # type: ignore[union-attr]
            ys = exchange_all_to_all(
                [env[n.operands[0]] for env, n in zip(envs, nodes, strict=True)], split_axis=split, concat_axis=concat
            )
            for env, n, y in zip(envs, nodes, ys, strict=True):
                env[n.results[0].name] = y
            continue
        for r, env in enumerate(envs):
            seg = steps[r][k]
            assert isinstance(seg, Segment)
            exe, seg_plan = prepare_segment(seg.program, weights, dev, plan.decisions)
            plans[r].append(seg_plan)
            env.update(exe.run({name: env[src] for name, src in seg.feeds.items()}))
            release = getattr(exe, "release", None)
            if release is not None:  # each piece runs once here: its device memory goes back at once
                release()
    outputs = {}
    for i, (name, sharding) in enumerate(plan.output_shardings.items()):  # outputs in the program's order
        pieces = [env[prog.outputs[i]] for env, prog in zip(envs, plan.programs, strict=True)]
        outputs[name] = pieces[0] if sharding is None else gather(pieces, sharding)
    return outputs, plans
