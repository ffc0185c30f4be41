"""Pipeline residency: which programs of a pipeline (text encoder, denoiser, VAE) hold device memory
during each of its stages, decided once against ONE memory budget from the programs' planned sizes,
after the planner has planned each program and before a backend prepares (allocates) any of them.

The decision, in the order tried (the first that fits wins; its arithmetic is recorded):
  all-resident          every program resident through every stage (prepared up front, kept across calls)
  release-text-encoder  the encode stage's programs alone, then the denoiser and the VAE together
  one-stage-at-a-time   each stage's programs alone (the text encoder released before the denoiser,
                        the denoiser before the VAE), when that way nothing streams
  stream-denoiser       the encode stage alone, then the denoiser planned with streaming within what
                        the VAE leaves
  one-stage-at-a-time   each stage alone, a stage's largest program streamed within what its stage's
                        other programs leave
Programs of no stage (`ALWAYS`) are resident in every stage and counted in each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from dif.errors import PlanError

STAGES = ("encode", "denoise", "decode")
"""The stages of a text-to-image pipeline, in run order."""

ALWAYS = "always"
"""The stage of a program that is not tied to one (kept resident through every stage)."""

ALL_RESIDENT = "all-resident"
RELEASE_TEXT_ENCODER = "release-text-encoder"
STREAM_DENOISER = "stream-denoiser"
ONE_STAGE_AT_A_TIME = "one-stage-at-a-time"


@frozen
class ProgramNeed:
    """What one program needs: `resident_bytes` = its plan's arena + every weight resident (the
    minimum memory of an all-resident plan); `stage`: one of `STAGES` or `ALWAYS`."""

    name: str
    stage: str
    resident_bytes: int


PlanWithin = Callable[[str, int], int]
"""(program name, bytes) -> the minimum memory of that program's plan within those bytes (streaming
what does not fit); raises `PlanError` when no plan fits."""


@frozen
class PipelineResidency:
    """The decision: `phases` maps each stage to the programs resident during it; `allowance_bytes`
    maps each program to the bytes its plan must fit in (below its `resident_bytes`: it streams);
    `arithmetic` says why, in bytes."""

    strategy: str
    available_bytes: int
    phases: Mapping[str, tuple[str, ...]]
    allowance_bytes: Mapping[str, int]
    arithmetic: str

    @property
    def all_resident(self) -> bool:
        return self.strategy == ALL_RESIDENT

    def resident_during(self, stage: str) -> tuple[str, ...]:
        """The programs that may hold device memory while `stage` runs (every program for `ALWAYS`)."""
        if stage == ALWAYS:
            return tuple(dict.fromkeys(n for names in self.phases.values() for n in names))
        return self.phases.get(stage, ())

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "available_bytes": self.available_bytes,
            "phases": {stage: list(names) for stage, names in self.phases.items()},
            "allowance_bytes": dict(self.allowance_bytes),
            "arithmetic": self.arithmetic,
        }


def decide_pipeline_residency(
    needs: Sequence[ProgramNeed], available: int, plan_within: PlanWithin
) -> PipelineResidency:
    """The first strategy of the module's list under which every stage's resident programs fit
    `available` bytes. `plan_within` is asked only for programs that would have to stream. Raises
    `PlanError` naming the program, the bytes it needs and the budget when even one stage at a time,
    streaming, does not fit."""
    size = {n.name: n.resident_bytes for n in needs}
    always = [n.name for n in needs if n.stage not in STAGES]
    by_stage = {stage: [n.name for n in needs if n.stage == stage] for stage in STAGES}
    used = [stage for stage in STAGES if by_stage[stage]]

    def terms(names: Sequence[str]) -> str:
        return " + ".join(f"{n} {size[n]}" for n in names) + f" = {sum(size[n] for n in names)} B"

    every = [n.name for n in needs]
    total = sum(size.values())
    if total <= available:
        return PipelineResidency(
            ALL_RESIDENT,
            available,
            {stage: tuple(every) for stage in used},
            dict(size),
            f"{terms(every)} <= available {available} B: every program resident through every stage",
        )
    why = [f"all together {terms(every)} > available {available} B"]
    encode = always + by_stage["encode"]
    later = always + by_stage["denoise"] + by_stage["decode"]
    enc_bytes, later_bytes = sum(size[n] for n in encode), sum(size[n] for n in later)
    if by_stage["encode"] and by_stage["denoise"] and enc_bytes <= available:
        phases = {"encode": tuple(encode), "denoise": tuple(later), "decode": tuple(later)}
        phases = {stage: names for stage, names in phases.items() if stage in used}
        if later_bytes <= available:
            return PipelineResidency(
                RELEASE_TEXT_ENCODER,
                available,
                phases,
                dict(size),
                "; ".join([*why, f"encode {terms(encode)} <= available; then denoise + decode {terms(later)} "
                           "<= available: the text encoder is released before the denoiser is prepared"]),
            )  # fmt: skip
        why.append(f"denoise + decode {terms(later)} > available")
        alone = [always + by_stage[stage] for stage in used]
        if all(sum(size[n] for n in names) <= available for names in alone):
            # nothing has to stream one stage at a time: re-preparing the VAE costs far less than pinning the
            # denoiser's streamed weights on every load and moving them over the bus at every step
            return PipelineResidency(
                ONE_STAGE_AT_A_TIME,
                available,
                {stage: tuple(names) for stage, names in zip(used, alone, strict=True)},
                dict(size),
                "; ".join([*why, *(f"{stage}: {terms(names)} <= available" for stage, names in zip(
                    used, alone, strict=True)), "each stage alone, nothing streamed"]),
            )  # fmt: skip
        denoiser = max(by_stage["denoise"], key=lambda n: size[n])
        left = available - (later_bytes - size[denoiser])
        if left <= 0:
            why.append(f"no room to stream '{denoiser}' beside the rest of its stages ({left} B left)")
        else:
            try:
                need = plan_within(denoiser, left)
            except PlanError as exc:
                why.append(f"'{denoiser}' does not stream within the {left} B the others leave ({_first(exc)})")
            else:
                return PipelineResidency(
                    STREAM_DENOISER,
                    available,
                    phases,
                    {**size, denoiser: left},
                    "; ".join([*why, f"'{denoiser}' planned with streaming within available - the rest of its "
                               f"stages = {left} B (needs {need} B); the text encoder is released before it"]),
                )  # fmt: skip
    if not used:
        raise PlanError(
            f"the programs {terms(every)} do not fit the memory budget of {available} B together, and none "
            "belongs to a stage that could run without the others",
            hint="raise --vram-budget (or leave it out to plan for all the free device memory)",
        )
    allowance = dict(size)
    lines = []
    for stage in used:
        names = always + by_stage[stage]
        largest = max(by_stage[stage], key=lambda n: size[n])
        left = available - (sum(size[n] for n in names) - size[largest])
        if size[largest] > left:
            if left <= 0:
                raise PlanError(
                    f"program '{largest}' ({stage}) has no room: the pipeline's memory budget is {available} B "
                    f"and the programs resident with it take {available - left} B ({terms(names)})",
                    hint="raise --vram-budget (or leave it out to plan for all the free device memory)",
                )
            try:
                need = plan_within(largest, left)
            except PlanError as exc:
                raise PlanError(
                    f"program '{largest}' ({stage}) does not fit the pipeline's memory budget of {available} B even "
                    f"alone in its stage and streaming: {_first(exc)}",
                    hint="raise --vram-budget (or leave it out to plan for all the free device memory)",
                ) from exc
            allowance[largest] = left
            lines.append(f"{stage}: '{largest}' streams within {left} B (needs {need} B)")
        else:
            lines.append(f"{stage}: {terms(names)} <= available")
    return PipelineResidency(
        ONE_STAGE_AT_A_TIME,
        available,
        {stage: tuple(always + by_stage[stage]) for stage in used},
        allowance,
        "; ".join([*why, *lines, "each stage's programs are prepared when it starts and released before the next"]),
    )


def _first(exc: PlanError) -> str:
    return str(exc).splitlines()[0]
