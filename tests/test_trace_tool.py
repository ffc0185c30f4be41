"""`dif trace` and DIF_TRACE_FILE on the CPU backend with the tiny FLUX.2 [klein] transformer: every op of
a run is one attributed event, the attribution adds up to the measured wall, any tool is traced by the
environment alone, and an incomplete trace file is refused naming the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif.trace.vocabulary import KINDS
from dif_tools.cli import build_cli


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(build_cli(), args, env=env, catch_exceptions=False)


def test_trace_program_attributes_every_op(tiny_klein: dict[str, Any], tmp_path: Path) -> None:
    saved = tmp_path / "t.jsonl"
    args = ["trace", "program", str(tiny_klein["difir"]), "--inputs", str(tiny_klein["inputs_path"])]
    args += ["--weights", str(tiny_klein["weights_path"]), "--backend", "cpu", "--runs", "2", "--json"]
    args += ["--save-trace", str(saved), "--save-program", str(tmp_path / "executed.difir")]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate_document(doc)
    a = doc["data"]["attribution"]
    assert a["executions"] == 2
    kinds = {r["name"] for r in a["by_kind"]}
    assert {"gemm", "attention"} <= kinds and kinds <= set(KINDS)
    # op events + copies never exceed the measured wall; the loop's own cost is the (reported) remainder
    assert 0 < a["attributed_ms"] <= a["wall_ms"]
    assert a["unattributed_ms"] == pytest.approx(a["wall_ms"] - a["attributed_ms"], abs=1e-5)
    blocks = {r["name"] for r in a["by_block"]}
    assert "transformer/transformer_blocks.0" in blocks and "transformer/single_transformer_blocks.0" in blocks

    from dif.serialize.difir import load_program
    from dif.trace.attribute import read_trace_file

    executed = load_program(tmp_path / "executed.difir")
    docs = [d for d in read_trace_file(saved) if d["data"]["stage"] == "run"]
    assert len(docs) == 2
    ops = [e for e in docs[0]["events"] if e["name"] == "op"]
    assert sorted(e["op_id"] for e in ops) == sorted(n.id for n in executed.nodes)  # one event per executed node
    by_id = executed.node_by_id
    assert all(by_id[e["op_id"]].op == e["opcode"] for e in ops)


def test_trace_file_from_any_tool_and_merge(tiny_klein: dict[str, Any], tmp_path: Path) -> None:
    trace_file = tmp_path / "run.jsonl"
    args = ["run", str(tiny_klein["difir"]), "--inputs", str(tiny_klein["inputs_path"])]
    args += ["--weights", str(tiny_klein["weights_path"]), "--out", str(tmp_path / "out.diftensor")]
    for _ in range(2):
        assert invoke([*args, "--backend", "cpu"], env={"DIF_TRACE_FILE": str(trace_file)}).exit_code == 0
    lines = trace_file.read_text().splitlines()
    assert [json.loads(x)["data"]["stage"] for x in lines] == ["prepare", "run", "prepare", "run"]
    result = invoke(["trace", "merge", str(trace_file), "--stage", "run", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate_document(doc)
    assert doc["data"]["attribution"]["executions"] == 2
    stage = doc["data"]["attribution"]["by_stage"]
    assert [r["name"] for r in stage] == [f"{tiny_klein['program'].name}:run"] and stage[0]["count"] == 2


def test_truncated_trace_is_refused(tiny_klein: dict[str, Any], tmp_path: Path) -> None:
    trace_file = tmp_path / "run.jsonl"
    args = ["run", str(tiny_klein["difir"]), "--inputs", str(tiny_klein["inputs_path"]), "--backend", "cpu"]
    args += ["--weights", str(tiny_klein["weights_path"]), "--out", str(tmp_path / "out.diftensor")]
    assert invoke(args, env={"DIF_TRACE_FILE": str(trace_file)}).exit_code == 0
    whole = trace_file.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(whole[: len(whole) - 40])
    result = CliRunner().invoke(build_cli(), ["trace", "merge", str(cut)])
    assert result.exit_code == 1
    assert "line 2" in result.output and "truncated" in result.output and "Traceback" not in result.output
    other = tmp_path / "other.jsonl"
    probe = invoke(["formats-table", "--json"])
    other.write_text(json.dumps(json.loads(probe.output)) + "\n")
    result = CliRunner().invoke(build_cli(), ["trace", "merge", str(other)])
    assert result.exit_code == 1 and "not a trace" in result.output


def test_tracing_off_records_nothing(tiny_klein: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from dif import trace
    from dif.runtime import prepare

    monkeypatch.delenv("DIF_TRACE_FILE", raising=False)
    monkeypatch.delenv("DIF_CAPTURE", raising=False)
    assert trace.begin("run", tiny_klein["program"], "cpu") is None
    exe, _ = prepare(tiny_klein["program"], tiny_klein["weights"], "cpu")
    with trace.collecting() as docs:
        exe.run(tiny_klein["inputs"])
    assert len(docs) == 1  # a collector turns it on ...
    exe.run(tiny_klein["inputs"])
    assert len(docs) == 1  # ... and nothing is recorded after it closes


def test_trace_recipe_attributes_each_stage(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    recipe = tmp_path / "mini.json"
    argv = ["{python}", "-m", "dif_tools", "run", f"{repo}/examples/mlp.difir"]
    argv += [
        "--inputs",
        f"{repo}/examples/mlp-inputs.safetensors",
        "--weights",
        f"{repo}/examples/mlp-weights.safetensors",
    ]
    argv += ["--out", "{workdir}/out.safetensors", "--backend", "cpu"]
    stages = [{"name": "mlp", "role": "measured", "argv": argv, "timeout_s": 120}]
    recipe.write_text(json.dumps({"kind": "dif-bench-recipe/1", "name": "mini", "stages": stages}))
    result = CliRunner().invoke(
        build_cli(), ["trace", "recipe", str(recipe), "--workdir", str(tmp_path / "w"), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    data = doc["data"]
    assert [s["status"] for s in data["stages"]] == ["ok"]
    stages_seen = {r["name"] for r in data["attribution"]["by_stage"]}
    assert stages_seen == {"mlp:prepare", "mlp:run"}  # the child process traced itself through DIF_TRACE_FILE
    assert data["outside_executions_ms"] > 0  # process start, imports, loading: outside any execution
    assert data["attribution"]["wall_ms"] < data["measured_wall_ms"]
