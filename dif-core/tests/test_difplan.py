""".difplan: round trip, hostile bytes fail with FormatError, and check_binding names what changed.

`fuzz_cases()` below is the entry the loader fuzz test (test_fuzz_loaders.py) can pick up.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from dif.errors import ChecksumError, DifError, FormatError, PlanBindingError, VersionError
from dif.fingerprint import fingerprint
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.difplan import (
    MAGIC,
    VERSION,
    BindingMismatch,
    check_binding,
    load_plan,
    plan_from_bytes,
    plan_to_bytes,
    save_plan,
)
from dif.plan.placement import HOST
from dif.plan.plan import Plan, plan_from_dict, plan_to_dict
from dif.plan.planner import plan_program, restream
from dif.serialize.container import pack
from dif.target import RuntimeBudget, TargetProfile

PROFILE = TargetProfile(
    backend="test", device="unit", arch="sm_90", compute_units=4, memory_bytes=1 << 34, dtypes=("f32", "bf16")
)
BUDGET = RuntimeBudget(free_memory_bytes=1 << 33)


def small_program(op: str = "exp", weight: str = "w") -> Program:
    b = ProgramBuilder("small")
    x = b.input("x", (2, 64), "f32")
    w = b.param(weight, (64,), "f32")
    with b.scope(block="blk0"):
        y = b.emit(op, b.emit("mul", x, w))
    b.output(b.emit("add", y, x))
    return b.build()


def small_plan() -> Plan:
    return plan_program(small_program(), PROFILE, BUDGET)


def recorded_plan() -> Plan:
    """`small_plan` with its weight streamed and its first node placed on the host."""
    program = small_program()
    plan = plan_program(program, evolve(PROFILE, host_threshold_bytes=2048), BUDGET)
    return restream(plan, program, [("block blk0", ["w"])])


def fuzz_cases() -> list[tuple[str, Callable[[bytes], object], Callable[[], bytes]]]:
    """(name, loader, valid_bytes_factory) for the loader fuzz test (also `dif.testing.fuzz.fuzz_cases`)."""
    from dif.testing.fuzz import fuzz_cases as library_cases

    return library_cases()


def test_fuzz_entries_yield_loadable_bytes() -> None:
    cases = fuzz_cases()
    assert [name for name, _, _ in cases] == ["difplan", "difplan-plan-section"]
    for _name, loader, factory in cases:
        plan = loader(factory())
        assert isinstance(plan, Plan) and plan.program_name == "tiny"


def test_round_trip_bytes_and_file(tmp_path: Path) -> None:
    plan = small_plan()
    data = plan_to_bytes(plan)
    assert data[:8] == MAGIC
    assert plan_from_bytes(data) == plan
    assert plan_to_bytes(plan_from_bytes(data)) == data  # canonical: sorted keys
    path = tmp_path / "p.difplan"
    save_plan(plan, path)
    loaded = load_plan(path)
    assert loaded == plan and loaded.binding.target_profile == PROFILE
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(plan)))) == plan


def test_round_trip_keeps_the_streaming_schedule_and_placement() -> None:
    plan = recorded_plan()
    assert plan.streaming.blocks and plan.placement[0] == HOST
    loaded = plan_from_bytes(plan_to_bytes(plan))
    assert loaded == plan
    assert loaded.streaming == plan.streaming and loaded.placement == plan.placement
    assert loaded.binding.target_profile.host_threshold_bytes == 2048
    check_binding(loaded, small_program(), plan.binding.target_profile, BUDGET)


def _container(doc: object) -> bytes:
    return pack(MAGIC, VERSION, {"plan": json.dumps(doc).encode()})


def test_hostile_bytes_raise_format_errors(tmp_path: Path) -> None:
    data = plan_to_bytes(small_plan())
    with pytest.raises(FormatError, match="truncated"):
        plan_from_bytes(data[:20])
    with pytest.raises(FormatError, match="magic"):
        plan_from_bytes(b"DIFIR\x00\x00\x00" + data[8:])
    with pytest.raises(VersionError):
        plan_from_bytes(data[:8] + struct.pack("<I", VERSION + 1) + data[12:])
    for old in (1, 2, 3):  # made before aliases / views at offsets / recorded streaming and placement: re-plan
        with pytest.raises(VersionError, match=f"version {old}"):
            plan_from_bytes(data[:8] + struct.pack("<I", old) + data[12:])
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    with pytest.raises(ChecksumError):
        plan_from_bytes(bytes(flipped))
    with pytest.raises(FormatError, match="not JSON"):
        plan_from_bytes(pack(MAGIC, VERSION, {"plan": b"{not json"}))
    with pytest.raises(FormatError, match="exactly one section"):
        plan_from_bytes(pack(MAGIC, VERSION, {"plan": b"{}", "extra": b""}))
    with pytest.raises(FormatError, match="malformed"):
        plan_from_bytes(_container([1, 2, 3]))
    with pytest.raises(FormatError, match="cannot read"):
        load_plan(tmp_path / "missing.difplan")


def test_schema_violations_are_rejected() -> None:
    doc = plan_to_dict(small_plan())
    for mutate in (
        lambda d: d.update(arena_bytes="1024"),  # strings are not ints
        lambda d: d.update(surprise=1),  # unknown keys
        lambda d: d.pop("schedule"),
        lambda d: d["buffers"][0].update(offset=None),
        lambda d: d["buffers"][0].update(offset=2**70),  # would overflow int64 arithmetic
        lambda d: d["buffers"][0].update(last_use=10**6),
        lambda d: d["binding"].update(min_memory_bytes=1),  # would slip past the budget check
        lambda d: d.update(residency={"w": "swapped"}),
    ):
        bad = json.loads(json.dumps(doc))
        mutate(bad)
        with pytest.raises(FormatError):
            plan_from_bytes(_container(bad))


def test_unsound_streaming_and_placement_are_rejected_on_load() -> None:
    doc = plan_to_dict(recorded_plan())
    for mutate, message in (
        (lambda d: d.pop("streaming"), "malformed"),
        (lambda d: d.pop("placement"), "malformed"),
        (lambda d: d["streaming"]["blocks"][0].update(offsets=[4]), "multiples of 256"),
        (lambda d: d["streaming"]["blocks"][0].update(slot=1), "staging slots"),
        (lambda d: d["streaming"].update(slot_bytes=0), "is not 1 slots x 0 B"),
        (lambda d: d["streaming"].update(blocks=[]), "for 0 blocks"),
        (lambda d: d.update(placement=["host"]), "placement lists 1 nodes"),
        (lambda d: d.update(placement=["gpu"] * len(d["schedule"])), "unknown node placement"),
    ):
        bad = json.loads(json.dumps(doc))
        mutate(bad)
        with pytest.raises(FormatError, match=message):
            plan_from_bytes(_container(bad))


def test_unsound_arena_is_rejected_on_load() -> None:
    doc = plan_to_dict(small_plan())
    for b in doc["buffers"]:
        b["offset"] = 0
    with pytest.raises(FormatError, match="overlap"):
        plan_from_bytes(_container(doc))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_bytes_only_raise_dif_errors(data: st.DataObject) -> None:
    raw = bytearray(plan_to_bytes(small_plan()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    with contextlib.suppress(DifError):
        plan_from_bytes(bytes(raw[:cut]))


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5))
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_documents_with_valid_checksums_only_raise_dif_errors(data: st.DataObject) -> None:
    """Past the checksum: a well-formed container around a mangled plan document."""
    doc = plan_to_dict(small_plan())
    node: object = doc
    while isinstance(node, dict | list) and node and data.draw(st.booleans()):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = data.draw(st.sampled_from(keys))
        if isinstance(node[key], dict | list) and node[key]:  # type: ignore[index]
            node = node[key]  # type: ignore[index]
            continue
        node[key] = data.draw(JSON_VALUES)  # type: ignore[index]
        break
    text = json.dumps(doc, allow_nan=True).encode()
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(text) - 1))
        text = text[:i] + bytes([data.draw(st.integers(0, 255))]) + text[i + 1 :]
    with contextlib.suppress(DifError):
        plan_from_bytes(pack(MAGIC, VERSION, {"plan": text}))


# -- binding ---------------------------------------------------------------------------------------


def _reasons(**changes: object) -> tuple[str, ...]:
    plan = small_plan()
    program: Program = changes.pop("program", small_program())  # type: ignore[assignment]
    profile: TargetProfile = changes.pop("profile", PROFILE)  # type: ignore[assignment]
    budget: RuntimeBudget = changes.pop("budget", BUDGET)  # type: ignore[assignment]
    plan = changes.pop("plan", plan)  # type: ignore[assignment]
    with pytest.raises(PlanBindingError) as info:
        check_binding(plan, program, profile, budget, **changes)  # type: ignore[arg-type]
    assert isinstance(info.value, BindingMismatch)
    return info.value.reasons


def test_binding_accepts_the_same_conditions() -> None:
    plan = small_plan()
    check_binding(plan, small_program(), PROFILE, BUDGET, precision="as-built")
    check_binding(plan, small_program(), PROFILE, RuntimeBudget(free_memory_bytes=plan.binding.min_memory_bytes))


def test_binding_program_changed() -> None:
    assert _reasons(program=small_program("tanh")) == ("program",)


def test_binding_same_structure_other_names() -> None:
    """The fingerprint ignores names, but the plan addresses weights by name: fail closed."""
    renamed = small_program(weight="blocks.0.w")
    assert fingerprint(renamed) == small_plan().program_fingerprint
    plan = small_plan()
    with pytest.raises(BindingMismatch, match="does not fit its values") as info:
        check_binding(plan, renamed, PROFILE, BUDGET)
    assert info.value.reasons == ("program",)


def test_binding_compiler_changed() -> None:
    plan = small_plan()
    old = evolve(plan, binding=evolve(plan.binding, compiler_revision="0.0.1+plan0"))
    assert _reasons(plan=old) == ("compiler",)


def test_binding_target_changed_names_fields() -> None:
    other = evolve(PROFILE, arch="sm_80", memory_bytes=1 << 35)
    plan = small_plan()
    with pytest.raises(BindingMismatch, match="differs in arch, memory_bytes") as info:
        check_binding(plan, small_program(), other, BUDGET)
    assert info.value.reasons == ("target",)
    assert _reasons(profile=evolve(PROFILE, backend="cpu")) == ("target",)


def test_binding_budget_too_small() -> None:
    need = small_plan().binding.min_memory_bytes
    assert _reasons(budget=RuntimeBudget(free_memory_bytes=need - 1)) == ("budget",)
    assert _reasons(budget=RuntimeBudget(free_memory_bytes=need, workspace_bytes=256)) == ("budget",)


def test_binding_precision_changed() -> None:
    assert _reasons(precision="bf16") == ("precision",)


def test_binding_lists_every_changed_condition() -> None:
    reasons = _reasons(
        program=small_program("tanh"),
        profile=evolve(PROFILE, arch="gfx90a"),
        budget=RuntimeBudget(free_memory_bytes=1),
        precision="fp8",
    )
    assert reasons == ("program", "target", "budget", "precision")
