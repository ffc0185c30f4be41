"""`dif plan make|show|diff|residency|explain|check` on the tiny FLUX.2 [klein] transformer planned for the
CPU backend: figures and decisions come from the .difplan, a budget cap streams weights and the diff says
so, explain reports exactly the decisions that name its subject (or says none does), and a plan made for
another target is refused naming the target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from attrs import evolve
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def invoke(args: list[str]) -> Any:
    return CliRunner().invoke(build_cli(), args)


def data_of(args: list[str]) -> dict[str, Any]:
    result = invoke([*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate_document(doc)
    return doc["data"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def plans(tiny_klein: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plans")
    ample = root / "ample.difplan"
    made = data_of(
        ["plan", "make", str(tiny_klein["difir"]), "--backend", "cpu", "--out", str(ample)]
        + ["--save-program", str(root / "opt.difir")]
    )
    # one byte short of everything resident: the planner must stream
    short = made["binding"]["min_memory_bytes"] - 1
    tight = root / "tight.difplan"
    data_of(
        [
            "plan",
            "make",
            str(tiny_klein["difir"]),
            "--backend",
            "cpu",
            "--out",
            str(tight),
            "--memory-budget",
            str(short),
        ]
    )
    return {"ample": ample, "tight": tight, "program": root / "opt.difir", "root": root}


def test_show_and_residency(plans: dict[str, Path]) -> None:
    from dif.plan.difplan import load_plan

    shown = data_of(["plan", "show", str(plans["ample"])])
    plan = load_plan(plans["ample"])
    assert shown["arena_bytes"] == plan.arena_bytes and shown["binding"]["target_backend"] == "cpu"
    assert [d["what"] for d in shown["decisions"]] == [d.what for d in plan.decisions]
    res = data_of(["plan", "residency", str(plans["tight"])])
    streamed = [w for w in res["weights"] if w["residency"] == "streamed"]
    assert streamed and all("block" in w and w["first_use"] <= w["last_use"] for w in streamed)
    assert any(d["what"].startswith("residency:") and "streamed" in d["why"] for d in res["decisions"])


def test_diff_names_the_streamed_weights(plans: dict[str, Path]) -> None:
    from dif.plan.difplan import load_plan

    diff = data_of(["plan", "diff", str(plans["ample"]), str(plans["tight"])])
    tight = load_plan(plans["tight"])
    assert diff["same_program"] and diff["same_schedule"]
    assert {r["param"] for r in diff["residency"]} == set(tight.streamed)
    assert all(r["a"] == "resident" and r["b"] == "streamed" for r in diff["residency"])
    assert any(f["field"] == "staging_bytes" for f in diff["fields"])
    same = data_of(["plan", "diff", str(plans["ample"]), str(plans["ample"])])
    assert same["fields"] == [] and same["residency"] == [] and same["decisions_only_a"] == []


def test_explain_reports_recorded_decisions_only(plans: dict[str, Path]) -> None:
    from dif.plan.difplan import load_plan
    from dif.serialize.difir import load_program

    plan = load_plan(plans["ample"])
    program = load_program(plans["program"])
    # a value a fusion pass names in its decision
    fused = next(d for d in plan.decisions if " applied " in d.what and " at " in d.what)
    value = fused.what.split(" at ")[1].split(",")[0].strip()
    node = program.producers[value]
    out = data_of(["plan", "explain", "op", str(node.id), str(plans["ample"]), "--program", str(plans["program"])])
    assert out["recorded"] and any(d["what"] == fused.what for d in out["decisions"])
    assert out["op"]["opcode"] == node.op and value in out["op"]["results"]
    # a value no decision names: reported as such, with its buffer
    quiet = next(
        r.name
        for n in program.nodes
        for r in n.results
        if not any(r.name in d.what.split() or f"{r.name}," in d.what for d in plan.decisions)
    )
    out = data_of(["plan", "explain", "tensor", quiet, str(plans["ample"])])
    assert out["recorded"] is False and "no decision" in out["note"] and out["buffer"]["size"] > 0
    result = invoke(["plan", "explain", "tensor", "no.such.weight", str(plans["ample"])])
    assert result.exit_code == 1 and "no.such.weight" in result.output


def test_plan_from_another_target_is_refused(plans: dict[str, Path], tiny_klein: dict[str, Any]) -> None:
    from dif.plan.difplan import load_plan, save_plan

    plan = load_plan(plans["ample"])
    assert data_of(["plan", "check", str(plans["ample"]), "--program", str(plans["program"])])["replayable"]
    other = evolve(
        plan.binding.target_profile,
        device="some other device",
        memory_bytes=plan.binding.target_profile.memory_bytes + 1,
    )
    foreign = evolve(plan, binding=evolve(plan.binding, target_profile=other, target_fingerprint=other.fingerprint()))
    path = plans["root"] / "foreign.difplan"
    save_plan(foreign, path)
    result = invoke(["plan", "check", str(path), "--program", str(plans["program"])])
    assert result.exit_code == 1 and "target fingerprint" in result.output and "Traceback" not in result.output
    result = invoke(["plan", "check", str(plans["ample"]), "--program", str(tiny_klein["difir"])])
    assert result.exit_code == 1 and "program fingerprint" in result.output  # the as-built program, not the planned one
    truncated = plans["root"] / "cut.difplan"
    truncated.write_bytes(plans["ample"].read_bytes()[:100])
    result = invoke(["plan", "show", str(truncated)])
    assert result.exit_code == 1 and str(truncated) in result.output and "Traceback" not in result.output
