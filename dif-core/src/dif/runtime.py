"""From a verified program to something that runs: pick a backend, optimize and plan for it, prepare.

    program + weights --optimize(profile)--> program' --plan_program(profile, budget)--> Plan
                      --backend.prepare--> Executable
The backend comes from the plugins (`dif.plugins.backends()`); nothing here names a device. The
optimizer pipeline is `DIF_PASSES` (default: the core fusions + plugin passes), applied only as far
as the backend's profile declares the ops it makes.
What a pipeline holds on top of this (its programs under one memory budget) is `dif.program_cache`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import evolve

from dif.backend import Availability, Backend, BackendInfo, Executable
from dif.env import DIF_BACKEND
from dif.errors import BackendError, BackendUnavailableError, DifError, UsageError
from dif.target import RuntimeBudget, TargetProfile

if TYPE_CHECKING:
    from dif.backend_checks import Coverage
    from dif.ir.program import Program
    from dif.plan.plan import Decision, Plan

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
INTERP = "interp"  # the backend name that means "the reference interpreter, no plan"


def availability(info: BackendInfo) -> Availability:
    """`info.is_available()`, with an exception inside it turned into an unavailable reason."""
    try:
        result = info.is_available()
    except Exception as exc:
        return Availability(False, f"is_available() raised {type(exc).__name__}: {exc}")
    if not isinstance(result, Availability):
        return Availability(False, f"is_available() returned {type(result).__name__}, not Availability")
    return result


def backend_status() -> list[tuple[BackendInfo, Availability]]:
    """Every registered backend with its availability, highest priority first."""
    from dif.plugins import backends

    infos = sorted(backends().values(), key=lambda i: (-i.rank(), i.name))
    return [(info, availability(info)) for info in infos]


def _no_backend(status: list[tuple[BackendInfo, Availability]]) -> BackendUnavailableError:
    if not status:
        return BackendUnavailableError(
            "no backend is registered", hint="install dif-backend-cpu (or check DIF_LOAD_PLUGINS and `dif plugins`)"
        )
    reasons = "; ".join(f"{info.name}: {avail.reason or 'unavailable'}" for info, avail in status)
    return BackendUnavailableError(f"no registered backend is available ({reasons})")


def get_backend(
    name: str | None = None,
    *,
    program: Program | None = None,
    create: Callable[[BackendInfo], Backend] | None = None,
) -> Backend:
    """The backend called `name`; with None, `DIF_BACKEND` or else the available one of highest priority.

    With `program`, a backend is only chosen for it when it declares every op (`BackendInfo.supported_ops`)
    and dtype (its profile's `dtypes`) the program uses: automatic selection falls through to the next
    available backend by priority, and a requested one that lacks any is refused, before anything is
    prepared. `create(info)` makes the chosen backend (default: `info.create()`; `ProgramCache` reuses
    instances). Raises `BackendUnavailableError` naming the reason, the known names when `name` is
    unknown, and for `program` the ops and dtypes each backend lacks."""
    from dif.plugins import backends

    make = create or create_backend
    name = name or DIF_BACKEND.get() or None
    if name is None:
        return _automatic(backend_status(), program, make)
    # A named backend is the only one asked whether it is available: probing the others (an OpenCL
    # platform enumeration and test build, ~0.2 s) would only slow a run that already chose.
    info = backends().get(name)
    if info is not None:
        avail = availability(info)
        if not avail.ok:
            raise BackendUnavailableError(f"backend '{name}' is not available: {avail.reason or 'no reason given'}")
        if program is None:
            return make(info)
        backend, gap = _covering(info, program, make)
        if backend is None:
            raise _refused(program, gap)
        return backend
    known = ", ".join(sorted(backends())) or "none"
    raise BackendUnavailableError(
        f"unknown backend '{name}' (known backends: {known})",
        hint="install the backend's distribution, or check `dif plugins` for one that failed to load",
    )


def _automatic(
    status: list[tuple[BackendInfo, Availability]], program: Program | None, make: Callable[[BackendInfo], Backend]
) -> Backend:
    """The available backend of highest priority that can run `program` (any, without one)."""
    gaps: list[Coverage] = []
    for info, avail in status:
        if not avail.ok:
            continue
        if program is None:
            return make(info)
        backend, gap = _covering(info, program, make)
        if backend is not None:
            return backend
        gaps.append(gap)
    if not gaps or program is None:
        raise _no_backend(status)
    absent = [f"{info.name}: {avail.reason or 'unavailable'}" for info, avail in status if not avail.ok]
    raise BackendUnavailableError(
        f"no available backend can run program '{program.name}': "
        + "; ".join(gap.describe() for gap in gaps)
        + (f" (not available: {'; '.join(absent)})" if absent else ""),
        hint="install or enable a backend that implements them (see `dif probe` and `dif plugins`)",
    )


def _covering(
    info: BackendInfo, program: Program, make: Callable[[BackendInfo], Backend]
) -> tuple[Backend | None, Coverage]:
    """(the backend, its coverage) when `info` declares every op and dtype of `program`, else (None, the gap).

    Ops come from the registration; dtypes from `info.probe()`, or from the created backend's profile
    when the registration has no probe (then the backend is created before its dtypes are known)."""
    from dif.backend_checks import coverage

    gap = coverage(program, info.name, _declared_ops(info))
    if not gap.ok:
        return None, gap
    backend = None
    if info.probe is not None:
        profile = _probe(info)
    else:
        backend = make(info)
        profile = backend.profile()
    gap = coverage(program, info.name, None, profile.dtypes)
    if not gap.ok:
        return None, gap
    return (backend if backend is not None else make(info)), gap


def _declared_ops(info: BackendInfo) -> frozenset[str] | None:
    try:
        return info.declared_ops()
    except Exception as exc:  # a broken declaration names the backend instead of escaping as a bug
        raise BackendError(
            f"backend '{info.name}': supported_ops raised {type(exc).__name__}: {exc}",
            hint="supported_ops must be op names or a function returning them",
        ) from exc


def _probe(info: BackendInfo) -> TargetProfile:
    assert info.probe is not None
    try:
        return info.probe()
    except DifError:
        raise
    except Exception as exc:
        raise BackendError(f"backend '{info.name}': probe() raised {type(exc).__name__}: {exc}") from exc


def _refused(program: Program, gap: Coverage) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"backend '{gap.backend}' cannot run program '{program.name}': {gap.describe()}",
        hint="leave the backend unset (no --backend, no DIF_BACKEND) to choose one that has them, "
        "or add the lowering to the backend and to its supported_ops",
    )


def check_coverage(program: Program, backend: Backend, profile: TargetProfile) -> None:
    """Refuse (`BackendUnavailableError`) to hand `program` to `backend` when it uses an op the backend's
    registration does not declare or a dtype outside `profile.dtypes`. `prepare` runs this on the
    optimized program, so an op or dtype a pass introduced is caught too. A backend no plugin
    registers under its name is checked for dtypes only."""
    from dif.backend_checks import coverage
    from dif.plugins import backends

    info = backends().get(str(backend.name))
    gap = coverage(program, str(backend.name), _declared_ops(info) if info is not None else None, profile.dtypes)
    if not gap.ok:
        raise _refused(program, gap)


def create_backend(info: BackendInfo) -> Backend:
    try:
        return info.create()
    except DifError:
        raise
    except Exception as exc:
        raise BackendError(f"backend '{info.name}' failed to start: {type(exc).__name__}: {exc}") from exc


def describe_backends() -> tuple[list[dict[str, Any]], dict[str, RuntimeBudget]]:
    """(telemetry `hardware` entries, budgets by backend) for every registered backend."""
    from dif.telemetry import hardware_entry

    hardware: list[dict[str, Any]] = []
    budgets: dict[str, RuntimeBudget] = {}
    for info, avail in backend_status():
        if not avail.ok:
            hardware.append(hardware_entry(info.name, reason=avail.reason or "unavailable"))
            continue
        try:
            backend = info.create()
            profile = backend.profile()
            budgets[info.name] = backend.budget()
        except Exception as exc:  # report, so one broken backend does not hide the others
            hardware.append(hardware_entry(info.name, reason=f"probe failed: {type(exc).__name__}: {exc}"))
            continue
        hardware.append(hardware_entry(info.name, profile=profile, reason=avail.reason))
    return hardware, budgets


def capped_budget(budget: RuntimeBudget, cap: int | None) -> RuntimeBudget:
    """`budget` with at most `cap` bytes of free memory (a user's `--vram-budget`); None keeps it.
    The planner then streams the weights that do not fit under the cap."""
    if cap is None:
        return budget
    if cap <= 0:
        raise UsageError(f"a memory budget must be a positive number of bytes, got {cap}")
    return evolve(budget, free_memory_bytes=min(budget.free_memory_bytes, cap))


def optimize_for(
    program: Program,
    backend: Backend,
    profile: TargetProfile,
    passes: Sequence[str] | None = None,
    *,
    extra: Sequence[str] = (),
    source: str | None = None,
) -> tuple[Program, tuple[Decision, ...]]:
    """`program` legalized for `profile` (`dif.passes.legalize`), then through the optimizer pipeline
    (None: `DIF_PASSES`, see `dif.passes.selected_passes`) followed by the passes of `extra` it lacks,
    checked against what `backend` runs; with the legalization's and the passes' decisions. `source`: where
    a given `passes` came from, for the plan (default: the caller asked for it)."""
    from dif.passes import optimize, selected_passes, summarize
    from dif.passes.legalize import legalize

    pipeline = selected_passes() if passes is None else tuple(passes)
    pipeline += tuple(p for p in extra if p not in pipeline)
    legal, legalized = legalize(program, profile)  # not a pass: a backend cannot run the program without it
    optimized, decisions = optimize(legal, target=profile, passes=pipeline)
    check_coverage(optimized, backend, profile)
    source = None if passes is None else (source or "requested by the caller")
    return optimized, (*legalized, *summarize(decisions, pipeline, source=source))


def prepare(
    program: Program,
    weights: Mapping[str, np.ndarray],
    backend: Backend | str | None = None,
    budget: RuntimeBudget | None = None,
    *,
    precision: str = "as-built",
    passes: Sequence[str] | None = None,
    decisions: Sequence[Decision] = (),
) -> tuple[Executable, Plan]:
    """Optimize `program` for `backend` (a name, an instance, or None for the default), plan it and
    prepare it.

    `weights` maps parameter names to host arrays of the declared shapes and dtypes (passes keep
    every parameter). `budget` defaults to what the backend reports now. `passes` names the
    optimizer pipeline (None: `DIF_PASSES`, see `dif.passes.selected_passes`); its decisions head
    the plan's, after `decisions` made before (a training step's autodiff recomputes). The executable
    runs the optimized program: same inputs, outputs and names."""
    from dif.plan.planner import plan_program

    if backend is None or isinstance(backend, str):
        backend = get_backend(backend, program=program)
    profile = backend.profile()
    optimized, passed = optimize_for(program, backend, profile, passes)
    plan = plan_program(
        optimized,
        profile,
        budget if budget is not None else backend.budget(),
        precision=precision,
        decisions=(*decisions, *passed),
    )
    from dif.weights.quantized import with_quantized_weights  # format passes derive weights at load

    return backend.prepare(optimized, plan, with_quantized_weights(optimized, weights)), plan
