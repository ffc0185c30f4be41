"""The optimizer's format search (`dif opt --formats`): which requested physical format a pipeline's linears
run in, measured, with every format's verdict recorded.

Each requested format is a candidate (its format pass, `dif.passes.quantize`, over every eligible linear of
the programs) judged in this order, the first failing stage rejecting it:

    capability -> verify -> execute -> numerical gate -> memory -> time

- capability: the target's facts (`dif.formats.assess`: legal, implemented, what it lacks). A format the target
  cannot run is excluded saying why ("no fp8 matrix units on this target ..."); with `emulate`, a format whose
  only lack is the matrix units runs on a backend that emulates it (the CPU reference), and is then judged on
  the gate and memory only (its time says nothing about the format).
- verify: the candidate's programs are rewritten and verified (the pass manager verifies every pass result);
  a format that converts no linear is rejected.
- execute: the whole schedule runs (`RunCandidate`), recording the gate's measurements.
- numerical gate: `dif.quality.format_gate.judge` against the baseline run (`GateConfig`); `no_gate` skips it
  with a warning (a forced format).
- memory: the denoiser's weights + arena with the format against the budget (and the baseline).
- time: the median denoiser forward against the baseline's; not judged when emulated, or when the baseline
  does not fit the budget and the format does (then it is memory that pays).

A format the gate rejects may get a per-block candidate right after it (`block_runs`, `_Search.by_blocks`):
its blocks ranked by the error each adds alone, the worst held in the run dtype (`DIF_FORMAT_KEEP`) until the
gate passes.

The chosen format is the first accepted one in the requested order (so a rejected format falls back to the
next); none accepted leaves the baseline. `FormatSearch.decisions()` is what the plan records.
"""

from __future__ import annotations

import os
import statistics
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from attrs import define, evolve, field, frozen

from dif.env import DIF_FORMAT_KEEP, DIF_FORMAT_STAGES, DIF_FP8_WEIGHTS, DIF_PASSES
from dif.errors import DifError, DifWarning, UsageError
from dif.formats import FORMATS, assess, legal_on
from dif.passes.quantize import ATTENTION_PASS, FORMAT_PASSES, WITH_ATTENTION, candidate_passes, split_candidate
from dif.plan.plan import Decision
from dif.quality.format_gate import GateConfig, GateReport, RunRecord, judge
from dif.target import TargetProfile

STAGES = ("capability", "verify", "execute", "gate", "memory", "time")
BLOCKS = "blocks"
"""The stage that rejects a per-block candidate no held set of blocks within the runs allowed made pass."""
ACCEPTED, REJECTED, EXCLUDED = "accepted", "rejected", "excluded"

MATRIX_UNITS = {"fp8-e4m3": "fp8", "int8": "int8"}
DEFAULT_GATE = GateConfig()


@frozen
class CandidateRun:
    """What a candidate's (or the baseline's) whole run gave: the gate's record, the programs it ran
    (stage -> (optimized program, optimizer decisions)), and the denoiser's memory (weights + arena)."""

    record: RunRecord
    programs: dict[str, tuple[Any, tuple[Decision, ...]]]
    denoiser_bytes: int


RunCandidate = Callable[[tuple[str, ...], RunRecord | None, tuple[str, ...]], CandidateRun]
"""(extra passes after the default pipeline, the baseline's record or None for the baseline, the blocks the format
passes leave in the run dtype, `DIF_FORMAT_KEEP`) -> its run."""


@define
class FormatCandidate:
    """One candidate (a requested format, or its per-block variant holding blocks): the target's facts, each
    stage's (stage, verdict, detail), the final verdict."""

    format: str
    facts: dict[str, Any]
    held: tuple[str, ...] = ()
    """Blocks left in the run dtype (`DIF_FORMAT_KEEP`): a per-block candidate after its format's gate failed."""
    attention: bool = False
    """Attention on fp8 matrix units too (`fp8-e4m3+attention`: `quantize_fp8_attention` after the format pass)."""
    stages: list[tuple[str, str, str]] = field(factory=list)
    verdict: str = ""
    reason: str = ""
    emulated: bool = False
    gate: GateReport | None = None
    numbers: dict[str, Any] = field(factory=dict)

    def stage(self, name: str, ok: bool | None, detail: str) -> bool:
        """Record `name`'s outcome (None: not judged); False when it rejects the candidate."""
        self.stages.append((name, "pass" if ok else ("not judged" if ok is None else "fail"), detail))
        if ok is False:
            self.verdict = EXCLUDED if name == "capability" else REJECTED
            self.reason = f"{name}: {detail}"
        return ok is not False

    @property
    def spec(self) -> str:
        """The candidate as `--formats` names it."""
        return self.format + (WITH_ATTENTION if self.attention else "")

    @property
    def passes(self) -> tuple[str, ...]:
        return candidate_passes(self.spec)

    @property
    def label(self) -> str:
        if not self.held:
            return self.spec
        return f"{self.spec} with {len(self.held)} block{'s' if len(self.held) > 1 else ''} held in the run dtype"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "attention": self.attention,
            "label": self.label,
            "held_blocks": list(self.held),
            "verdict": self.verdict,
            "reason": self.reason,
            "emulated": self.emulated,
            "facts": self.facts,
            "stages": [{"stage": s, "verdict": v, "detail": d} for s, v, d in self.stages],
            "gate": None if self.gate is None else self.gate.to_dict(),
            "numbers": self.numbers,
        }


@define
class FormatSearch:
    """The search's record: baseline numbers, every candidate, the chosen format (None: the baseline)."""

    target: str
    gate: GateConfig
    baseline: dict[str, Any]
    candidates: list[FormatCandidate]
    chosen: str | None
    chosen_held: tuple[str, ...] = ()

    def decisions(self) -> list[Decision]:
        """One plan decision per candidate (verdict, reason), then the choice."""
        out = [Decision(f"format {c.label}: {c.verdict}", c.reason) for c in self.candidates]
        if self.chosen is None:
            why = "no requested format was accepted; linears stay in the baseline precision"
            out.append(Decision("formats: baseline", why))
        else:
            order = ", ".join(dict.fromkeys(c.spec for c in self.candidates))
            held = f" (held in the run dtype: {', '.join(self.chosen_held)})" if self.chosen_held else ""
            what = self.chosen + held
            out.append(Decision(f"formats: {what}", f"the first accepted of the requested order ({order})"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "gate": self.gate.to_dict(),
            "baseline": self.baseline,
            "candidates": [c.to_dict() for c in self.candidates],
            "chosen": self.chosen,
            "chosen_held_blocks": list(self.chosen_held),
            "decisions": [{"what": d.what, "why": d.why} for d in self.decisions()],
        }


@contextmanager
def passes_appended(extra: Sequence[str], stages: str = "denoise", held: Sequence[str] = ()) -> Iterator[None]:
    """`DIF_PASSES` set to the default pipeline followed by `extra` while the block runs (programs are
    optimized when a pipeline first registers them), restored after; `DIF_FORMAT_STAGES=stages` (the programs
    they convert), `DIF_FORMAT_KEEP=held` (the blocks they leave) and `DIF_FP8_WEIGHTS=dequantize` with it, so
    a checkpoint stored in fp8 gives the baseline in the run dtype and a candidate only its own format (the
    fp8-e4m3 one still reads the stored bytes, `dif.weights.quantized`)."""
    values = {DIF_FP8_WEIGHTS.name: "dequantize", DIF_FORMAT_STAGES.name: stages, DIF_FORMAT_KEEP.name: ",".join(held)}
    if extra:
        values[DIF_PASSES.name] = ",".join(("default", *extra))
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def capability_facts(fmt: str, profile: TargetProfile) -> dict[str, Any]:
    verdict = assess(fmt, profile)
    f = FORMATS.get(fmt)
    return {
        "legal": verdict.legal,
        "legal_reason": verdict.reason,
        "usage": verdict.usage.value,
        "usage_reason": verdict.usage_reason,
        "executes": verdict.executes,
        "implemented_by": f.implemented_by,
        "requires_dtypes": list(f.requires_dtypes),
        "requires_tensor_core": list(f.requires_tensor_core),
        "target_tensor_core_formats": list(profile.tensor_core_formats),
        "bits": f.bits,
    }


def _capability(c: FormatCandidate, fmt: str, profile: TargetProfile, emulate: bool) -> bool:
    f = FORMATS.get(fmt)
    if fmt not in FORMAT_PASSES:
        return c.stage(
            "capability", False, f"dif has no format pass for {fmt} (formats with one: {', '.join(FORMAT_PASSES)})"
        )
    if f.implemented_by and f.implemented_by not in profile.capabilities:
        return c.stage(
            "capability", False, f"backend '{profile.backend}' does not implement it (no '{f.implemented_by}')"
        )
    legal, reason = legal_on(f, profile)
    if legal:
        return c.stage("capability", True, reason)
    units = [u for u in f.requires_tensor_core if u not in profile.tensor_core_formats]
    lacks_only_units = bool(units) and legal_on(evolve(f, requires_tensor_core=()), profile)[0]
    if lacks_only_units and emulate:
        c.emulated = True
        return c.stage("capability", True, f"emulated by backend '{profile.backend}' ({reason})")
    if lacks_only_units:
        unit = MATRIX_UNITS.get(fmt, fmt)
        listed = ", ".join(profile.tensor_core_formats) or "none"
        return c.stage(
            "capability",
            False,
            f"no {unit} matrix units on this target (tensor-core formats listed: {listed}); --emulate runs it anyway",
        )
    return c.stage("capability", False, reason)


def _format_decisions(run: CandidateRun, pass_name: str) -> tuple[int, int, list[str]]:
    """(nodes converted, nodes left, the pass's decision lines) over every program of the run."""
    applied = left = 0
    lines: list[str] = []
    for _program, decisions in run.programs.values():
        for d in decisions:
            if d.what.startswith(f"{pass_name}: "):
                count = d.what.split(": ", 1)[1].split(" ")
                n = int(count[1]) if len(count) > 1 and count[1].isdigit() else 0
                applied += n if count[0] == "applied" else 0
                left += n if count[0] == "skipped" else 0
                lines.append(f"{d.what}: {d.why}")
    return applied, left, lines


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def search_formats(
    formats: Sequence[str],
    *,
    profile: TargetProfile,
    run: RunCandidate,
    gate: GateConfig = DEFAULT_GATE,
    emulate: bool = False,
    no_gate: bool = False,
    budget_bytes: int | None = None,
    block_runs: int = 0,
) -> FormatSearch:
    """Judge every format of `formats` (names of `dif.formats`, `fp8-e4m3+attention` for fp8 attention too, in
    preference order) on `profile`'s backend, each through the stages of the module doc; `run` executes the
    baseline and each candidate. With `block_runs` > 0, a format the gate rejects gets a per-block candidate
    after it (`_Search.by_blocks`), spending at most that many more runs."""
    specs = [split_candidate(spec) for spec in formats]
    for fmt, _ in specs:
        FORMATS.get(fmt)  # an unknown name is a UsageError naming the known ones
    if not formats:
        raise UsageError(
            "the format search needs at least one format", hint=f"e.g. --formats {','.join(FORMAT_PASSES)}"
        )
    search = _Search(run, run((), None, ()), gate, no_gate, budget_bytes)
    candidates: list[FormatCandidate] = []
    for fmt, attention in specs:
        c = FormatCandidate(fmt, capability_facts(fmt, profile), attention=attention)
        candidates.append(c)
        if not _capability(c, fmt, profile, emulate):
            continue
        got = search.judge(c)
        if got is not None and block_runs > 0 and c.verdict == REJECTED and c.reason.startswith("gate:"):
            candidates.append(search.by_blocks(c, got, block_runs))
    chosen = next((c for c in candidates if c.verdict == ACCEPTED), None)
    return FormatSearch(
        profile.backend,
        gate,
        search.baseline,
        candidates,
        None if chosen is None else chosen.spec,
        () if chosen is None else chosen.held,
    )


@define
class _Search:
    """The baseline run and the stages after capability, shared by every candidate."""

    run: RunCandidate
    base: CandidateRun
    gate: GateConfig
    no_gate: bool
    budget_bytes: int | None

    @property
    def base_forward(self) -> float:
        return _median(self.base.record.forward_seconds)

    @property
    def base_fits(self) -> bool:
        return self.budget_bytes is None or self.base.denoiser_bytes <= self.budget_bytes

    @property
    def baseline(self) -> dict[str, Any]:
        return {
            "median_forward_s": self.base_forward,
            "denoise_s": self.base.record.denoise_seconds,
            "denoiser_bytes": self.base.denoiser_bytes,
            "fits_budget": self.base_fits,
            "budget_bytes": self.budget_bytes,
        }

    def execute(self, c: FormatCandidate, held: tuple[str, ...] = ()) -> CandidateRun | None:
        """The candidate's run (None: it did not verify, lower or run, recorded as its verdict)."""
        try:
            return self.run(c.passes, self.base.record, held)
        except DifError as exc:  # a program that does not verify, lower or run
            stage = "verify" if "verif" in type(exc).__name__.lower() else "execute"
            c.stage(stage, False, f"{type(exc).__name__}: {exc}")
            return None

    def gate_of(self, got: CandidateRun) -> GateReport:
        return judge(
            self.base.record.step_outputs,
            got.record.forced_outputs,
            self.gate,
            reference_image=self.base.record.image,
            candidate_image=got.record.image,
        )

    def judge(self, c: FormatCandidate, got: CandidateRun | None = None) -> CandidateRun | None:
        """Candidate `c` (run now unless `got` is its run) through verify -> execute -> gate -> memory -> time,
        its verdict recorded; its run, None when it did not run."""
        got = got if got is not None else self.execute(c, c.held)
        if got is None:
            return None
        pass_name = FORMAT_PASSES[c.format]
        applied, left, lines = _format_decisions(got, pass_name)
        c.numbers["pass_decisions"] = lines
        c.numbers.update(linears_converted=applied, linears_left=left)
        ok, detail = applied > 0, f"{applied} linears converted, {left} left"
        if c.attention:
            converted, kept, attention_lines = _format_decisions(got, ATTENTION_PASS)
            c.numbers["pass_decisions"] += attention_lines
            c.numbers.update(attentions_converted=converted, attentions_left=kept)
            ok, detail = ok and converted > 0, f"{detail}, {converted} attentions converted, {kept} left"
        if not c.stage("verify", ok, f"{detail} ({'programs verified' if ok else 'nothing to run in the format'})"):
            return got
        c.stage("execute", True, f"{len(got.record.step_outputs)} steps ran, image decoded")
        if self.no_gate:
            warnings.warn(f"format {c.label} forced without the numerical gate", DifWarning, stacklevel=3)
            c.stage("gate", None, "skipped (--no-gate): the format is forced")
        else:
            c.gate = self.gate_of(got)
            if not c.stage("gate", c.gate.passed, c.gate.reason):
                return got
        budget = self.budget_bytes
        fits = budget is None or got.denoiser_bytes <= budget
        c.numbers.update(denoiser_bytes=got.denoiser_bytes, median_forward_s=_median(got.record.forward_seconds))
        saved = self.base.denoiser_bytes - got.denoiser_bytes
        where = "no budget given" if budget is None else f"budget {budget} B"
        if not c.stage("memory", fits, f"denoiser {got.denoiser_bytes} B ({saved:+d} B saved vs baseline; {where})"):
            return got
        t, base_t = c.numbers["median_forward_s"], self.base_forward
        speed = f"median forward {t * 1e3:.2f} ms vs baseline {base_t * 1e3:.2f} ms"
        if c.emulated:
            c.stage("time", None, f"emulated: {speed} says nothing about the format")
        elif not self.base_fits:
            c.stage("time", None, f"the baseline does not fit the budget and this format does ({speed})")
        elif not c.stage("time", t < base_t, speed):
            return got
        c.verdict = ACCEPTED
        c.reason = "; ".join(f"{s}: {d}" for s, v, d in c.stages if s in ("gate", "memory", "time"))
        return got

    def by_blocks(self, whole: FormatCandidate, got: CandidateRun, runs: int) -> FormatCandidate:
        """The per-block candidate after `whole` failed the gate: each block of its converted linears is run
        alone in the format (the others held), giving that block's worst-step rel-L2 and 1 - cosine; the
        blocks are held in the run dtype from the worst down, starting from the fewest whose remaining errors
        add up (rel-L2 in quadrature, 1 - cosine linearly, as independent small errors do) within the gate,
        one more each time the gate still fails, within `runs` runs in all."""

        def variant(held: tuple[str, ...]) -> FormatCandidate:
            v = FormatCandidate(whole.format, whole.facts, held, whole.attention, emulated=whole.emulated)
            v.stages.append(("capability", "pass", "as for the whole format"))
            return v

        c = variant(())
        blocks = converted_blocks(got)
        if len(blocks) < 2:
            c.stage(BLOCKS, False, f"the converted linears lie in {len(blocks)} block: holding it converts none")
            return c
        if runs < len(blocks) + 1:
            n = len(blocks)
            c.stage(BLOCKS, False, f"ranking its {n} blocks and trying the result takes {n + 1} runs, more than {runs}")
            return c
        errors: dict[str, tuple[float, float]] = {}
        for b in blocks:
            alone = self.execute(c, tuple(o for o in blocks if o != b))
            if alone is None:
                return c
            report = self.gate_of(alone)
            errors[b] = (report.worst_rel_l2, 1.0 - report.worst_cosine)
        runs -= len(blocks)
        c.numbers["block_errors"] = {b: {"rel_l2": e, "one_minus_cosine": d} for b, (e, d) in errors.items()}
        worst = sorted(blocks, key=lambda b: errors[b][0], reverse=True)
        held = next(  # at least one: the whole format failed the gate already
            j
            for j in range(1, len(worst) + 1)
            if sum(errors[b][0] ** 2 for b in worst[j:]) ** 0.5 <= self.gate.rel_l2_max
            and sum(errors[b][1] for b in worst[j:]) <= 1.0 - self.gate.cosine_min
        )
        tried: list[str] = []
        while held < len(worst) and runs > 0:
            trial = variant(tuple(worst[:held]))
            self.judge(trial)
            runs -= 1
            tried.append(f"{held} held: {trial.reason}")
            if trial.verdict == ACCEPTED or not trial.reason.startswith("gate:"):
                trial.numbers.update(block_errors=c.numbers["block_errors"], block_trials=tried)
                return trial
            held += 1
        c.numbers["block_trials"] = tried
        if held < len(worst):
            c.stage(BLOCKS, False, f"no held set passed the gate within the runs allowed ({len(tried)} tried)")
        else:
            c.stage(BLOCKS, False, "the gate passes only with every block held, which converts no linear")
        return c


QUANTIZED_OPS = ("scaled_linear", "int4_linear")


def converted_blocks(got: CandidateRun) -> list[str]:
    """The provenance blocks of the linears a candidate's run converted (`QUANTIZED_OPS`), in program order."""
    blocks: dict[str, None] = {}
    for program, _decisions in got.programs.values():
        for node in getattr(program, "nodes", ()):
            prov = program.provenance.get(node.id) if node.op in QUANTIZED_OPS else None
            if prov is not None and prov.block:
                blocks[prov.block] = None
    return list(blocks)


def pipeline_candidates(
    load: Callable[[], Any],
    prompt: str,
    *,
    width: int,
    height: int,
    steps: int,
    seed: int,
    stages: str = "denoise",
) -> RunCandidate:
    """A `RunCandidate` over a `TextToImagePipeline`: each call loads a fresh pipeline (`load()`) with the
    extra passes appended to the default pipeline over the programs of `stages` (`DIF_FORMAT_STAGES`), runs
    `record_run` and reads back the programs it ran and the denoiser's memory (weights + arena, all
    resident); the pipeline is dropped after."""
    import gc

    from dif.quality.format_gate import record_run

    def run_one(extra: tuple[str, ...], teacher: RunRecord | None, held: tuple[str, ...] = ()) -> CandidateRun:
        with passes_appended(extra, stages, held):
            pipe = load()
            try:
                record = record_run(pipe, prompt, width=width, height=height, steps=steps, seed=seed, teacher=teacher)
                programs = {
                    name: (program, decisions) for name, (_s, program, decisions) in pipe.optimized_programs().items()
                }
                report = pipe.memory_report()["programs"]
                denoiser = sum(int(r["all_resident_bytes"]) for r in report.values() if r["stage"] == "denoise")
            finally:
                del pipe
                gc.collect()
        return CandidateRun(record, programs, denoiser)

    return run_one
