"""The programs of one pipeline (text encoder, denoiser, VAE) on one backend, under ONE memory budget.

Where it sits: a frontend's pipeline holds a `ProgramCache`; each program is built, optimized and planned
once per shape (`dif.runtime`) against the budget for all of them (the backend's free memory when the
pipeline starts, or a lower cap: `--vram-budget`), with `dif.plan.pipeline` deciding which are resident
during which stage; programs are released and prepared again between stages when they do not fit together,
and weights still too large are streamed.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import define, evolve, field

from dif.backend import Backend, BackendInfo, Executable
from dif.errors import DifWarning, PlanError
from dif.runtime import INTERP, Runner, capped_budget, create_backend, get_backend, optimize_for
from dif.target import RuntimeBudget

if TYPE_CHECKING:
    from dif.ir.program import Program
    from dif.plan.pipeline import PipelineResidency
    from dif.plan.plan import Decision, Plan
    from dif.weights.bind import PendingScan
    from dif.weights.fp8 import Fp8Choice

ALWAYS = "always"  # `dif.plan.pipeline.ALWAYS` (not imported: `import dif.program_cache` stays light)


@define(eq=False)
class _Entry:
    """One program of a pipeline: optimized and planned on its backend; prepared while `executable` is set.
    `alone` is its plan within the pipeline's whole budget, `plan` the one the pipeline's decision chose."""

    key: Hashable
    stage: str
    name: str
    program: Program
    weights: Mapping[str, np.ndarray]
    backend: Backend
    budget: RuntimeBudget
    decisions: tuple[Decision, ...]
    alone: Plan
    plan: Plan
    runner: Runner = lambda inputs: {}
    executable: Executable | None = None
    plans: dict[int, Plan] = field(factory=dict)  # by the bytes they were planned within
    timings: dict[str, float] = field(factory=dict)  # seconds: build (and bind), optimize, plan
    group: str | None = None  # programs of one group run one at a time (`ProgramCache.get`)
    prepared: int = 0
    released: int = 0
    scans: list[PendingScan] = field(factory=list)  # NaN / inf scans its backend runs on the upload

    @property
    def resident_bytes(self) -> int:
        """Arena + every weight: what the program holds with nothing streamed."""
        return int(self.alone.arena_bytes + self.alone.param_bytes)

    @property
    def need(self) -> str:
        """Its name in the pipeline's decision: the program's, or its group's (one need for all of them)."""
        return f"{self.group} (one at a time)" if self.group else self.name


@define
class ProgramCache:
    """The programs of one pipeline, each built, bound and planned once per key on its backend, and
    prepared while the pipeline's memory decision says it is resident.

    backend: a backend name, None for the default (`DIF_BACKEND`, else per program the available one of
    highest priority that has its ops and dtypes, see `get_backend`), or "interp" for the reference
    interpreter (no plan, no backend). vram_budget: the device bytes the whole pipeline may hold (text
    encoder + denoiser + VAE together); without it, the backend's free memory when the first program is
    planned. Programs registered inside `planning()` form a run: when it ends, `dif.plan.pipeline`
    decides from their planned sizes what is resident during which stage; all resident: they are
    prepared at once; otherwise `enter(stage)` releases the programs the stage does not keep and prepares
    the stage's own. A runner whose program was released prepares it again when called. Programs got
    outside `planning()` are prepared at once, each within what those prepared before leave.
    """

    backend: str | None = None
    vram_budget: int | None = None
    plan_peak_bytes: int = 0  # the largest prepared plan's arena peak + parameter bytes
    load_seconds: float = 0.0  # time spent building, binding, planning and preparing
    budget: RuntimeBudget | None = field(init=False, default=None)  # the pipeline budget the latest plan used
    residency: dict[str, dict[str, Any]] = field(init=False, factory=dict)  # by program name: `memory_report`
    decision: dict[str, PipelineResidency] = field(init=False, factory=dict)  # by backend name
    releases: list[str] = field(init=False, factory=list)  # "NAME before STAGE", in order
    fp8_weights: dict[str, str] = field(init=False, factory=dict)  # by program name: what its fp8 weights do
    int4_weights: dict[str, str] = field(init=False, factory=dict)  # by program name: what its Q4_0 weights do
    _notes: set[str] = field(init=False, factory=set)  # fp8 notes warned already (one per source and reason)
    _runners: dict[Hashable, Runner] = field(init=False, factory=dict)  # under "interp"
    _entries: dict[Hashable, _Entry] = field(init=False, factory=dict)
    _run: list[_Entry] | None = field(init=False, default=None)  # the programs of the latest `planning()`
    _planning: bool = field(init=False, default=False)
    _budgets: dict[str, RuntimeBudget] = field(init=False, factory=dict)  # by backend name, fixed at first use
    _backend: Backend | None = field(init=False, default=None)  # the latest program's
    _backends: dict[str, Backend] = field(init=False, factory=dict)  # by name: each created once

    @property
    def backend_name(self) -> str:
        """The backend that ran the latest program prepared, before any the default one ("interp" =
        the reference interpreter)."""
        if self.backend == INTERP:
            return INTERP
        if self._backend is None:
            self._backend = get_backend(self.backend, create=self._instance)
        return str(self._backend.name)

    def _instance(self, info: BackendInfo) -> Backend:
        """The backend `info` registers, created once for all the programs (one device context)."""
        if info.name not in self._backends:
            self._backends[info.name] = create_backend(info)
        return self._backends[info.name]

    # -- registering ---------------------------------------------------------------------------------
    def get(
        self,
        key: Hashable,
        build: Callable[[], tuple[Program, Mapping[str, np.ndarray]]],
        stage: str = ALWAYS,
        group: str | None = None,
        *,
        keep_fp8: bool = False,
    ) -> Runner:
        """The runner cached under `key`; on a miss `build()` returns (program, bound weights), which is
        optimized and planned now (weights are not read). `stage`: the pipeline stage that runs it
        (`dif.plan.pipeline.STAGES`; `ALWAYS`: resident throughout). Programs of one `group` (a tiled
        decode's decoders, one per tile shape) run one after another: the decision counts the largest of
        them, and preparing one releases the others. `keep_fp8`: run the linear weights the checkpoint stores as
        fp8-e4m3 in fp8 where the backend executes it (`dif.weights.fp8.choose_fp8`; a frontend's denoiser).
        Outside `planning()` the program is also prepared now."""
        if self.backend == INTERP:
            return self._interpreted(key, build, keep_fp8)
        entry = self._entries.get(key)
        if entry is None:
            from dif.weights.bind import deferred_scans

            start = time.perf_counter()
            with deferred_scans() as scans:
                program, weights = build()
            built = time.perf_counter()
            entry = self._entries[key] = self._register(key, stage, program, weights, scans, keep_fp8)
            entry.timings = {"build_s": built - start, **entry.timings}
            entry.group = group
            self.load_seconds += time.perf_counter() - start
        if self._run is not None and entry not in self._run:
            self._run.append(entry)
            if not self._planning:  # a program the run did not announce (a new shape mid-run)
                self._decide()
        if not self._planning:
            self._ensure(entry)
        return entry.runner

    def keys(self) -> set[Hashable]:
        """The keys of every program registered so far (planned, prepared or interpreted)."""
        return set(self._entries) | set(self._runners)

    def fits_resident(self, key: Hashable) -> bool:
        """Whether the program registered under `key` fits the pipeline's budget with all its weights
        resident (arena + weights <= the budget's available bytes); True under "interp" (no budget)."""
        entry = self._entries.get(key)
        return entry is None or entry.resident_bytes <= self._available(entry.budget)

    def discard(self, key: Hashable) -> None:
        """Forget the program registered under `key` (released first when prepared): a frontend that
        registered it, then chose another way (a tiled decode instead of the whole one)."""
        entry = self._entries.pop(key, None)
        self._runners.pop(key, None)
        if entry is None:
            return
        self._release(entry, "discarded")
        if self._run is not None and entry in self._run:
            self._run.remove(entry)

    def _interpreted(
        self, key: Hashable, build: Callable[[], tuple[Program, Mapping[str, np.ndarray]]], keep_fp8: bool
    ) -> Runner:
        from dif.interp import interpret
        from dif.weights.fp8 import choose_fp8
        from dif.weights.gguf_int4 import choose_int4

        runner = self._runners.get(key)
        if runner is None:
            from dif.weights.bind import deferred_scans

            start = time.perf_counter()
            with deferred_scans() as scans:
                program, weights = build()
            for scan in scans:
                scan.on_host()
            if (fp8 := choose_fp8(program, weights, None, keep=keep_fp8)) is not None:
                self._fp8_outcome(program.name, fp8, program)
            if (int4 := choose_int4(program, weights, None, keep=keep_fp8)) is not None:
                self.int4_weights[program.name] = int4.outcome(program)[0]
            resolved = dict(weights)
            runner = self._runners[key] = lambda inputs: interpret(program, inputs, resolved)
            self.load_seconds += time.perf_counter() - start
        return runner

    def _register(
        self,
        key: Hashable,
        stage: str,
        program: Program,
        weights: Mapping[str, np.ndarray],
        scans: list[PendingScan],
        keep_fp8: bool = False,
    ) -> _Entry:
        from dif.weights.fp8 import choose_fp8
        from dif.weights.gguf_int4 import choose_int4

        backend = self._backend = get_backend(self.backend, program=program, create=self._instance)
        if not getattr(backend, "scans_weights_on_device", False):
            for scan in scans:  # checked now, before anything of the run is prepared
                scan.on_host()
            scans = []
        budget = self.budget = self._pipeline_budget(backend)
        start = time.perf_counter()
        profile = backend.profile()
        fp8 = choose_fp8(program, weights, profile, keep=keep_fp8)  # quantize_fp8 over weights stored as fp8
        int4 = choose_int4(program, weights, profile, keep=keep_fp8)  # int4_linear over GGUF Q4_0 blocks
        if int4 is not None:  # before the optimizer, whose fusions would concatenate their weights
            program = int4.apply(program, profile)
        passes, held_back = self._stage_passes(stage)
        # a pipeline without its format passes says so once, in the held-back decision
        extra, source = (fp8.passes if fp8 else ()), ("DIF_PASSES less its format passes" if held_back else None)
        optimized, decisions = optimize_for(program, backend, profile, passes, extra=extra, source=source)
        if held_back is not None:
            decisions = (*decisions, held_back)
        optimized_at = time.perf_counter()
        taken = {e.name for e in self._entries.values()}
        name = program.name if program.name not in taken else f"{program.name} #{len(taken) + 1}"
        if fp8 is not None:
            decisions = (*decisions, self._fp8_outcome(name, fp8, optimized))
        if int4 is not None:
            from dif.plan.plan import Decision

            summary, why = int4.outcome(optimized)
            self.int4_weights[name] = summary
            decisions = (*decisions, Decision(f"Q4_0 weights: {summary}", why))
        alone = self._plan(optimized, backend, budget, decisions)
        from dif.weights.quantized import with_quantized_weights  # format passes derive weights at load

        weights = with_quantized_weights(optimized, weights)
        entry = _Entry(key, stage, name, optimized, weights, backend, budget, decisions, alone, alone, scans=scans)
        entry.timings = {"optimize_s": optimized_at - start, "plan_s": time.perf_counter() - optimized_at}
        entry.plans[self._available(budget)] = alone
        entry.runner = lambda inputs: self._execute(entry, inputs)
        return entry

    @staticmethod
    def _stage_passes(stage: str) -> tuple[tuple[str, ...] | None, Decision | None]:
        """The optimizer pipeline of a program of `stage` (None: `DIF_PASSES` as it is) and the decision on
        the format passes it holds back (`dif.passes.quantize.scoped_to_stage`; None: none held back)."""
        from dif.passes import selected_passes
        from dif.passes.quantize import scoped_to_stage

        passes, held_back = scoped_to_stage(selected_passes(), stage)
        return (None, None) if held_back is None else (passes, held_back)

    def _fp8_outcome(self, name: str, fp8: Fp8Choice, optimized: Program) -> Decision:
        """The plan decision on program `name`'s fp8 weights, recorded in `fp8_weights`; its note warned
        (`DifWarning`) once per pipeline when they run dequantized."""
        from dif.plan.plan import Decision

        summary, why, note = fp8.outcome(optimized)
        self.fp8_weights[name] = summary
        if note is not None and note not in self._notes:
            self._notes.add(note)
            warnings.warn(note, DifWarning, stacklevel=4)
        return Decision(f"fp8 weights: {summary}", why)

    def _pipeline_budget(self, backend: Backend) -> RuntimeBudget:
        """The one budget of every program on `backend`: its free memory when the first was planned,
        capped by `vram_budget`."""
        name = str(backend.name)
        if name not in self._budgets:
            self._budgets[name] = capped_budget(backend.budget(), self.vram_budget)
        return self._budgets[name]

    @staticmethod
    def _available(budget: RuntimeBudget) -> int:
        return budget.free_memory_bytes - budget.workspace_bytes

    def _plan(self, program: Program, backend: Backend, budget: RuntimeBudget, decisions: Sequence[Decision]) -> Plan:
        from dif.plan.planner import plan_program

        try:
            return plan_program(program, backend.profile(), budget, decisions=decisions)
        except PlanError as exc:
            if self.vram_budget is None:
                raise
            raise PlanError(
                f"within the memory budget of {self.vram_budget} B: {str(exc).splitlines()[0]}",
                hint="raise --vram-budget (or leave it out to plan for all the free device memory)",
            ) from exc

    def _plan_within(self, entry: _Entry, nbytes: int) -> Plan:
        """`entry`'s plan within `nbytes` of device memory (streaming what does not fit), made once."""
        if entry.alone.binding.min_memory_bytes <= nbytes:
            return entry.alone
        if nbytes not in entry.plans:
            budget = evolve(entry.budget, free_memory_bytes=nbytes + entry.budget.workspace_bytes)
            entry.plans[nbytes] = self._plan(entry.program, entry.backend, budget, entry.decisions)
        return entry.plans[nbytes]

    # -- the pipeline's decision ---------------------------------------------------------------------
    @contextmanager
    def planning(self) -> Iterator[None]:
        """Register the programs of one run (the `get` calls inside), then decide what is resident when
        (`dif.plan.pipeline.decide_pipeline_residency`, from their plans, before anything is allocated);
        when all fit together, prepare them all now."""
        self._run, self._planning = [], True
        try:
            yield
        finally:
            self._planning = False
        self._decide()
        if all(d.all_resident for d in self.decision.values()):
            for entry in self._run:
                self._ensure(entry)

    def _decide(self) -> None:
        from dif.plan.pipeline import ProgramNeed, decide_pipeline_residency

        run = self._run or []
        self.decision = {}
        for backend in dict.fromkeys(str(e.backend.name) for e in run):
            group = [e for e in run if str(e.backend.name) == backend]
            available = self._available(group[0].budget)
            stale = [
                e
                for e in self._entries.values()
                if e.executable is not None and e not in run and str(e.backend.name) == backend
            ]
            held = sum(e.plan.binding.min_memory_bytes for e in stale)
            if held and held + sum(e.resident_bytes for e in group) > available:
                for e in stale:  # programs of an earlier run (another size) make room for this one's
                    self._release(e, "this run")
            by_need: dict[str, list[_Entry]] = {}
            for e in group:
                by_need.setdefault(e.need, []).append(e)
            needs = [
                ProgramNeed(need, members[0].stage, max(m.resident_bytes for m in members))
                for need, members in by_need.items()
            ]

            def plan_within(need: str, nbytes: int, by_need: dict[str, list[_Entry]] = by_need) -> int:
                return max(self._plan_within(m, nbytes).binding.min_memory_bytes for m in by_need[need])

            decision = decide_pipeline_residency(needs, available, plan_within)
            self.decision[backend] = decision
            for e in group:
                want = self._plan_within(e, decision.allowance_bytes[e.need])
                if want is not e.plan:
                    if e.executable is not None:
                        self._release(e, "re-planning")
                    e.plan = want

    def enter(self, stage: str) -> bool:
        """Make the device hold what `stage` needs: release the prepared programs the decision does not
        keep during it, then prepare the stage's programs of the run. True when anything was released or
        prepared (the caller times that apart from the stage's work)."""
        if self._run is None:
            return False
        changed = False
        for backend, decision in self.decision.items():
            if not decision.all_resident:
                keep = set(decision.resident_during(stage))
                for e in self._entries.values():
                    if e.executable is not None and str(e.backend.name) == backend and e.need not in keep:
                        changed = self._release(e, stage) or changed
        for e in self._run:
            if e.stage in (stage, ALWAYS) and e.executable is None:
                self._ensure(e)
                changed = True
        return changed

    # -- preparing and releasing ---------------------------------------------------------------------
    def _ensure(self, entry: _Entry) -> Executable:
        """`entry` prepared: room made for it first (the programs its stage does not keep released;
        without a decision, planned within what the prepared programs leave)."""
        if entry.executable is not None:
            return entry.executable
        decision = self.decision.get(str(entry.backend.name))
        if decision is None:
            held = sum(
                e.plan.binding.min_memory_bytes
                for e in self._entries.values()
                if e.executable is not None and e.backend is entry.backend
            )
            entry.plan = self._plan_within(entry, self._available(entry.budget) - held)
        elif not decision.all_resident:
            keep = set(decision.resident_during(entry.stage))
            for e in self._entries.values():
                if e.executable is not None and e.backend is entry.backend and e.need not in keep:
                    self._release(e, entry.stage)
        if entry.group is not None and decision is not None and not decision.all_resident:  # one at a time
            for e in self._entries.values():
                if e.executable is not None and e.group == entry.group and e is not entry:
                    self._release(e, f"{entry.name} ({entry.group})")
        from dif.progress import loading

        start = time.perf_counter()
        plan = self._with_decision(entry, decision)
        with loading(entry.name, plan.resident_bytes):
            if entry.scans:  # the backend tests what it uploaded, before the program first runs
                entry.executable = entry.backend.prepare(
                    entry.program, plan, entry.weights, nonfinite_check=self._scan_report(entry.scans)
                )
                entry.scans = []
            else:
                entry.executable = entry.backend.prepare(entry.program, plan, entry.weights)
        self.load_seconds += time.perf_counter() - start
        entry.prepared += 1
        self.plan_peak_bytes = max(self.plan_peak_bytes, int(plan.peak_bytes + plan.param_bytes))
        self._record(entry, plan)
        return entry.executable

    @staticmethod
    def _scan_report(scans: list[PendingScan]) -> Callable[[set[str], set[str]], None]:
        """What a backend that scans its uploads calls with (flagged, covered) parameter names."""

        def report(flagged: set[str], covered: set[str]) -> None:
            for scan in scans:
                scan.report(flagged, covered)

        return report

    def _with_decision(self, entry: _Entry, decision: PipelineResidency | None) -> Plan:
        """`entry.plan` with the pipeline's decision appended to its recorded decisions."""
        from dif.plan.plan import Decision

        if decision is None:
            return entry.plan
        during = [stage for stage, names in decision.phases.items() if entry.need in names]
        what = (
            f"pipeline residency: {decision.strategy}; '{entry.name}' resident during {', '.join(during) or 'none'}"
            f", planned within {decision.allowance_bytes[entry.need]} B"
        )
        return evolve(entry.plan, decisions=(*entry.plan.decisions, Decision(what, decision.arithmetic)))

    def _execute(self, entry: _Entry, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._ensure(entry).run(inputs)

    def _release(self, entry: _Entry, before: str) -> bool:
        """Free `entry`'s device memory (`Executable.release`, where the backend has one)."""
        if entry.executable is None:
            return False
        release = getattr(entry.executable, "release", None)
        if callable(release):
            release()
        entry.executable = None
        entry.released += 1
        self.releases.append(f"{entry.name} before {before}")
        if entry.name in self.residency:
            self.residency[entry.name]["released"] = entry.released
        return True

    def _record(self, entry: _Entry, plan: Plan) -> None:
        streamed = set(plan.streamed)
        timings = getattr(entry.executable, "timings", {})
        self.residency[entry.name] = {
            "stage": entry.stage,
            "params": len(plan.residency),
            "streamed_params": len(streamed),
            "streamed_bytes": sum(p.type.nbytes for p in entry.program.params if p.name in streamed),
            "resident_bytes": plan.resident_bytes,
            "min_memory_bytes": plan.binding.min_memory_bytes,
            "all_resident_bytes": entry.resident_bytes,
            "prepared": entry.prepared,
            "released": entry.released,
            # where the program's load went: built (and bound), optimized, planned here; then prepared
            # (upload, lowering, capture ...) as the backend measured it
            "register_s": {k: round(v, 4) for k, v in entry.timings.items()},
            "prepare_s": {k: round(float(v), 4) for k, v in timings.items() if k.endswith("_s")},
        }

    def optimized(self) -> dict[str, tuple[str, Program, tuple[Decision, ...]]]:
        """By program name: (stage, the optimized program, the optimizer's decisions) of every program
        registered so far (the format search reads what a candidate's passes did)."""
        return {e.name: (e.stage, e.program, e.decisions) for e in self._entries.values()}

    def prepared(self) -> dict[str, Executable]:
        """By program name: the executables prepared now (what a profiler times)."""
        return {e.name: e.executable for e in self._entries.values() if e.executable is not None}

    def memory_report(self) -> dict[str, Any]:
        """What the plans were made against and what they stream, for run reports: the cap
        (`vram_budget_bytes`, None without one), the pipeline's budget (`free_memory_bytes`), parameter
        counts over all prepared programs, per program name: stage, params, streamed_params, streamed_bytes,
        resident_bytes, min_memory_bytes (arena + resident weights + staging), all_resident_bytes, how often
        it was prepared and released; `pipeline`: the residency decision by backend
        (`PipelineResidency.to_dict`); `releases`: "NAME before STAGE" in order."""
        programs = {name: dict(r) for name, r in self.residency.items()}
        return {
            "vram_budget_bytes": self.vram_budget,
            "free_memory_bytes": self.budget.free_memory_bytes if self.budget is not None else None,
            "params": sum(r["params"] for r in programs.values()),
            "streamed_params": sum(r["streamed_params"] for r in programs.values()),
            "streamed_bytes": sum(r["streamed_bytes"] for r in programs.values()),
            "programs": programs,
            "pipeline": {backend: d.to_dict() for backend, d in self.decision.items()},
            "releases": list(self.releases),
        }
