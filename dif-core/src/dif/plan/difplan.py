"""`.difplan`: a Plan on disk, and the check that it may be replayed here (after planning, before a
backend's `prepare`).

The file is a `dif.serialize.container` with one section, `plan`: the plan as canonical JSON
(sorted keys). Loading validates everything (container checksum, schema, arena soundness, the
streaming schedule and node placement) and
raises only `FormatError` subclasses. `check_binding` then fails closed, naming every condition
that differs from what the plan was made for.
"""

from __future__ import annotations

import json
from pathlib import Path

from dif.errors import FormatError, PlanBindingError, PlanError
from dif.fingerprint import fingerprint
from dif.ir.program import Program
from dif.plan.plan import (
    RESIDENCIES,
    Plan,
    check_arena,
    check_plan,
    check_records,
    compiler_revision,
    plan_from_dict,
    plan_to_dict,
)
from dif.serialize.container import pack, read_bytes, unpack, write_atomic
from dif.target import RuntimeBudget, TargetProfile

MAGIC = b"DIFPLAN\x00"
VERSION = 4
"""Container version; follows `PLAN_FORMAT_REV` (2: buffers carry `alias_of`; 3: views with offsets and
pitched rows; 4: the streaming schedule and node placement). Older files are refused with a
`VersionError` rather than read with guessed fields: re-plan them."""
SUFFIX = ".difplan"


class BindingMismatch(PlanBindingError):
    """`check_binding` failed; `reasons` holds one short code per changed condition:
    "program", "compiler", "target", "budget", "precision"."""

    def __init__(self, message: str, reasons: tuple[str, ...], *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reasons = reasons


def plan_to_bytes(plan: Plan) -> bytes:
    doc = json.dumps(plan_to_dict(plan), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return pack(MAGIC, VERSION, {"plan": doc.encode()})


def plan_from_bytes(data: bytes, *, what: str = "<difplan bytes>") -> Plan:
    """Parse and validate a `.difplan`; raises `FormatError` (or a subclass) on anything wrong."""
    _version, sections = unpack(data, MAGIC, (VERSION,), what)
    if set(sections) != {"plan"}:
        raise FormatError(f"{what}: expected exactly one section 'plan', found {sorted(sections)}")
    try:
        doc = json.loads(sections["plan"].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{what}: plan section is not JSON ({type(exc).__name__})") from None
    try:
        plan = plan_from_dict(doc)
        check_arena(plan)
        check_records(plan)
    except PlanError as exc:
        raise FormatError(f"{what}: {exc}") from None
    bad = sorted(r for r in set(plan.residency.values()) if r not in RESIDENCIES)
    if bad:
        raise FormatError(f"{what}: unknown weight residency {bad}, expected one of {RESIDENCIES}")
    parts = plan.arena_bytes + plan.resident_bytes + plan.staging_bytes
    if plan.binding.min_memory_bytes != parts or min(plan.resident_bytes, plan.staging_bytes) < 0:
        raise FormatError(
            f"{what}: minimum memory {plan.binding.min_memory_bytes} B is not arena + resident + staging ({parts} B)"
        )
    return plan


def save_plan(plan: Plan, path: str | Path) -> None:
    write_atomic(path, plan_to_bytes(plan))


def load_plan(path: str | Path) -> Plan:
    return plan_from_bytes(read_bytes(path, str(path)), what=str(path))


def profile_differences(made_for: TargetProfile, here: TargetProfile) -> list[str]:
    """Names of the profile fields that differ, e.g. ['arch', 'memory_bytes']."""
    a, b = made_for.to_dict(), here.to_dict()
    return [key for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key)]


def check_binding(
    plan: Plan,
    program: Program,
    profile: TargetProfile,
    budget: RuntimeBudget,
    *,
    precision: str | None = None,
) -> None:
    """Fail closed unless `plan` may run `program` on `profile` within `budget`.

    Raises `BindingMismatch` (a `PlanBindingError`) listing every changed condition: program
    fingerprint (or, for the same structure, value / parameter names the plan addresses), compiler
    revision, target fingerprint (with the differing profile fields), budget below the plan's
    minimum memory, and — when `precision` is given — precision policy. A different budget class
    alone is not a failure: the plan stays valid while its minimum memory fits.
    """
    problems: list[tuple[str, str]] = []
    got = fingerprint(program)
    if got != plan.program_fingerprint:
        problems.append(("program", f"program fingerprint {got} != {plan.program_fingerprint} the plan was made for"))
    else:
        # Same structure, but the plan addresses values and weights by name: they must match too.
        try:
            check_plan(plan, program)
        except PlanError as exc:
            problems.append(("program", f"same structure but the plan does not fit its values: {exc}"))
    binding = plan.binding
    if binding.compiler_revision != compiler_revision():
        problems.append(
            ("compiler", f"compiler revision {compiler_revision()} != {binding.compiler_revision} that made the plan")
        )
    if profile.fingerprint() != binding.target_fingerprint:
        fields = profile_differences(binding.target_profile, profile)
        detail = f" (differs in {', '.join(fields)})" if fields else ""
        problems.append(
            (
                "target",
                f"target fingerprint {profile.fingerprint()} ({profile.backend}) != {binding.target_fingerprint} "
                f"({binding.target_backend}){detail}",
            )
        )
    available = budget.free_memory_bytes - budget.workspace_bytes
    if available < binding.min_memory_bytes:
        problems.append(
            (
                "budget",
                f"budget too small: {available} B available (free {budget.free_memory_bytes} - workspace "
                f"{budget.workspace_bytes}) < plan minimum {binding.min_memory_bytes} B",
            )
        )
    if precision is not None and precision != plan.precision:
        problems.append(("precision", f"precision policy '{precision}' != '{plan.precision}' of the plan"))
    if problems:
        lines = "\n".join(f"  - {text}" for _code, text in problems)
        raise BindingMismatch(
            f"plan for '{plan.program_name}' cannot be replayed here:\n{lines}",
            tuple(code for code, _text in problems),
            hint="re-plan (dif plan) for this program, compiler and target",
        )
