"""Planner aliasing: reshape results share their operand's arena bytes (root lifetime extended), only
for targets that declare `alias:reshape`; check_arena / check_plan police aliases; .difplan keeps
them. The executors that honour aliases are tested in their backends (CPU: random programs)."""

from __future__ import annotations

import itertools
import json

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from dif.errors import FormatError, PlanError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.plan.difplan import MAGIC, VERSION, plan_from_bytes, plan_to_bytes
from dif.plan.plan import ALIAS_CAPABILITY, Plan, check_arena, check_plan, live_bytes, plan_to_dict
from dif.plan.planner import plan_program
from dif.serialize.container import pack
from dif.target import RuntimeBudget, TargetProfile

ALIASING = TargetProfile(backend="test", device="unit", memory_bytes=1 << 34, capabilities=(ALIAS_CAPABILITY,))
COPYING = TargetProfile(backend="test", device="unit", memory_bytes=1 << 34)
BIG = RuntimeBudget(free_memory_bytes=1 << 34)


def reshapes() -> Program:
    """exp(x) -> reshape -> reshape -> neg, plus a reshape of the input and one used as an output."""
    b = ProgramBuilder("reshapes")
    x = b.input("x", (4, 64), "f32")
    a = b.emit("exp", x)  # %0
    r1 = b.emit("reshape", a, shape=(256,))  # %1 alias of %0
    r2 = b.emit("reshape", r1, shape=(16, 16))  # %2 alias of %0 (chains point at the root)
    rx = b.emit("reshape", x, shape=(16, 16))  # %3 input: own slot
    n = b.emit("neg", r2)  # %4
    c = b.emit("add", n, rx)  # %5
    b.output(c, r1)
    return b.build()


def test_reshape_results_alias_their_root() -> None:
    program = reshapes()
    plan = plan_program(program, ALIASING, BIG)
    check_plan(plan, program)
    buf = plan.buffer_by_name
    assert buf["%1"].alias_of == "%0" and buf["%2"].alias_of == "%0"
    assert buf["%3"].alias_of is None  # a reshape of an input copies (inputs live outside the arena)
    assert buf["%1"].offset == buf["%2"].offset == buf["%0"].offset
    end = len(plan.schedule) - 1
    assert buf["%0"].last_use == end  # %1 is an output, so its root lives to the end
    assert (buf["%2"].first_use, buf["%2"].last_use) == (2, 4)
    roots = [b for b in plan.buffers if b.alias_of is None]
    copied = plan_program(program, COPYING, BIG)
    assert sum(b.size for b in roots) == sum(b.size for b in copied.buffers) - 2 * 1024  # two slots fewer
    assert plan.peak_bytes <= copied.peak_bytes and plan.peak_bytes <= sum(b.size for b in roots)
    whats = [d.what for d in plan.decisions]
    assert any(w.startswith("views: 2 reshape placed inside another value's bytes") for w in whats)
    assert all(b.alias_of is None for b in copied.buffers)
    assert any(d.what.startswith("views: off") and ALIAS_CAPABILITY in d.why for d in copied.decisions)
    assert plan_program(program, COPYING, BIG, alias=True).buffers == plan.buffers  # explicit override


def test_check_arena_polices_aliases() -> None:
    program = reshapes()
    plan = plan_program(program, ALIASING, BIG)

    def with_buffer(name: str, **changes: object) -> Plan:
        return evolve(plan, buffers=tuple(evolve(b, **changes) if b.name == name else b for b in plan.buffers))

    for changes, match in (
        ({"alias_of": "%9"}, "root must be another buffer"),
        ({"alias_of": "%2"}, "root must be another buffer"),  # %2 is itself an alias
        ({"alias_of": "%1"}, "root must be another buffer"),  # its own root
        ({"offset": plan.buffer_by_name["%0"].offset + 256}, "not inside the root's bytes"),
        ({"nbytes": 4096, "size": 4096}, "not inside the root's bytes"),
    ):
        with pytest.raises(PlanError, match=match):
            check_arena(with_buffer("%1", **changes))
    short_root = with_buffer("%0", last_use=3)
    with pytest.raises(PlanError, match="not inside the root's"):
        check_arena(short_root)
    # an alias made by a node that is not a reshape of its root: sound as an arena ...
    bogus = with_buffer("%4", alias_of="%0", offset=plan.buffer_by_name["%0"].offset)
    bogus = evolve(bogus, peak_bytes=int(live_bytes(bogus.buffers, len(plan.schedule)).max()))
    check_arena(bogus)
    # ... but rejected against the program: neg does not keep its operand's bytes
    with pytest.raises(PlanError, match="is a view of '%0' but neg node 4 does not put it there"):
        check_plan(bogus, program)


def test_difplan_round_trips_aliases_and_rejects_bad_ones() -> None:
    plan = plan_program(reshapes(), ALIASING, BIG)
    data = plan_to_bytes(plan)
    back = plan_from_bytes(data)
    assert back == plan and back.buffer_by_name["%2"].alias_of == "%0"
    assert plan_to_bytes(back) == data
    doc = plan_to_dict(plan)
    for bad, match in ((7, "malformed"), (["%0"], "malformed"), ("%2", "not itself an alias")):
        mangled = json.loads(json.dumps(doc))
        next(b for b in mangled["buffers"] if b["name"] == "%1")["alias_of"] = bad
        with pytest.raises(FormatError, match=match):
            plan_from_bytes(pack(MAGIC, VERSION, {"plan": json.dumps(mangled).encode()}))


# -- property: random DAGs with reshapes (structure only; the planner reads nothing else) -------------

SIZES = (1, 7, 64, 300)


@st.composite
def dags_with_reshapes(draw: st.DrawFn) -> Program:
    inputs = [Value(f"in{i}", TensorType((draw(st.sampled_from(SIZES)),), "f32")) for i in range(2)]
    values = list(inputs)
    nodes: list[Node] = []
    for k in range(draw(st.integers(1, 25))):
        if draw(st.booleans()):  # a reshape of any value so far (inputs included)
            src = draw(st.sampled_from(values))
            result = Value(f"%{k}", TensorType((1, src.type.numel), src.type.dtype))
            nodes.append(Node(k, "reshape", (src.name,), (result,), {"shape": result.type.shape}))
        else:
            operands = draw(st.lists(st.sampled_from([v.name for v in values]), min_size=1, max_size=3))
            result = Value(f"%{k}", TensorType((draw(st.sampled_from(SIZES)),), "f32"))
            nodes.append(Node(k, "any", operands, (result,)))
        values.append(result)
    outputs = draw(st.lists(st.sampled_from([n.results[0].name for n in nodes]), min_size=1, max_size=3, unique=True))
    return Program("dag", inputs, [], nodes, outputs)


@settings(max_examples=150, deadline=None)
@given(dags_with_reshapes())
def test_random_dags_with_aliases_keep_roots_alive_and_disjoint(program: Program) -> None:
    plan = plan_program(program, ALIASING, BIG)
    check_plan(plan, program)
    buf = plan.buffer_by_name
    for step in range(len(plan.schedule)):
        live = [b for b in plan.buffers if b.first_use <= step <= b.last_use]
        for b in live:  # an alias is only live while its root is
            if b.alias_of is not None:
                assert buf[b.alias_of] in live
        roots = sorted((b.offset, b.offset + b.size, b.name) for b in live if b.alias_of is None)
        for (_, end, a), (start, _, c) in itertools.pairwise(roots):
            assert end <= start, f"step {step}: {a} and {c} overlap"
    reshaped = {n.results[0].name: n.operands[0] for n in program.nodes if n.op == "reshape"}
    for name, src in reshaped.items():  # every reshape of an arena value aliases, of an input does not
        assert (buf[name].alias_of is not None) == (src in buf)
