"""Fuzz entries for dif's binary loaders owned by the planner area: `(name, loader, valid_bytes_factory)`
tuples a parser fuzz test mutates. The loader must raise only `DifError` subclasses on any bytes."""

from __future__ import annotations

from collections.abc import Callable

from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plan.difplan import MAGIC, VERSION, plan_from_bytes, plan_to_bytes
from dif.plan.plan import ALIAS_CAPABILITY, Plan
from dif.plan.planner import plan_program, restream
from dif.serialize.container import pack, unpack
from dif.target import RuntimeBudget, TargetProfile

FuzzCase = tuple[str, Callable[[bytes], object], Callable[[], bytes]]


def tiny_program() -> Program:
    """x[2,64] * w[64] -> exp -> reshape [128] -> reshape [2,64] -> + x; one weight block."""
    b = ProgramBuilder("tiny")
    x = b.input("x", (2, 64), "f32")
    w = b.param("w", (64,), "f32")
    with b.scope(block="blk0"):
        y = b.emit("exp", b.emit("mul", x, w))
    y = b.emit("reshape", b.emit("reshape", y, shape=(128,)), shape=(2, 64))
    b.output(b.emit("add", y, x))
    return b.build()


def tiny_plan() -> Plan:
    """The plan of `tiny_program` on a target that aliases reshapes and runs tiny nodes on the host, with
    its weight streamed (so fuzzing reaches `alias_of`, the streaming schedule and the placement)."""
    profile = TargetProfile(
        backend="fuzz", device="none", arch="x", memory_bytes=1 << 30, dtypes=("f32",),
        capabilities=(ALIAS_CAPABILITY,), host_threshold_bytes=2048,
    )  # fmt: skip
    program = tiny_program()
    plan = plan_program(program, profile, RuntimeBudget(free_memory_bytes=1 << 30))
    return restream(plan, program, [("blk0", ["w"])])


def _plan_section() -> bytes:
    return unpack(plan_to_bytes(tiny_plan()), MAGIC, (VERSION,), "fuzz")[1]["plan"]


def _load_plan_section(section: bytes) -> Plan:
    """Past the checksum: a well-formed container around (possibly mangled) plan JSON."""
    return plan_from_bytes(pack(MAGIC, VERSION, {"plan": section}))


def fuzz_cases() -> list[FuzzCase]:
    """Whole `.difplan` files, and the JSON plan section alone (so mutations reach the schema checks)."""
    return [
        ("difplan", plan_from_bytes, lambda: plan_to_bytes(tiny_plan())),
        ("difplan-plan-section", _load_plan_section, _plan_section),
    ]
