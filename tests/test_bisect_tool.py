"""`dif bisect` finds an injected divergence in the tiny FLUX.2 [klein] transformer: one op of a copy of
the program is perturbed (its attention's softmax scale), both programs run on the CPU backend with
DIF_CAPTURE, and the report must name that op's result as the first failure, the value produced just
before it as the last pass, and, when only block boundaries were captured, must not blame the op it
never saw. Also: the oracle-fixture manifest protocol and the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from attrs import evolve
from click.testing import CliRunner

from dif.ir.program import Program
from dif.serialize.difir import save_program
from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(build_cli(), args, env=env)


def perturbed(program: Program) -> tuple[Program, int]:
    """A copy whose first sdpa uses 0.5 / sqrt(head_dim) instead of 1 / sqrt(head_dim)."""
    node = next(n for n in program.nodes if n.op == "sdpa")
    q_type = program.types[node.operands[0]]
    changed = evolve(node, attrs={**node.attrs, "scale": 0.5 / q_type.shape[-1] ** 0.5})
    nodes = tuple(changed if n.id == node.id else n for n in program.nodes)
    return evolve(program, nodes=nodes), node.id


def capture(tk: dict[str, Any], difir: Path, folder: Path, mode: str) -> Path:
    args = ["run", str(difir), "--inputs", str(tk["inputs_path"]), "--weights", str(tk["weights_path"])]
    args += ["--out", str(folder / "out.diftensor"), "--backend", "cpu"]
    env = {"DIF_CAPTURE": mode, "DIF_CAPTURE_DIR": str(folder), "DIF_PASSES": "none"}
    result = invoke(args, env=env)
    assert result.exit_code == 0, result.output
    (path,) = folder.glob("*.0.diftensor")
    return path


@pytest.fixture(scope="module")
def runs(tiny_klein: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bisect")
    bad, op_id = perturbed(tiny_klein["program"])
    save_program(bad, root / "bad.difir")
    out = {"bad": bad, "op_id": op_id, "bad_difir": root / "bad.difir"}
    for key, difir, mode in (("ref", tiny_klein["difir"], "ops"), ("ops", root / "bad.difir", "ops")):
        folder = root / key
        folder.mkdir()
        out[key] = capture(tiny_klein, difir, folder, mode)
    folder = root / "blocks"
    folder.mkdir()
    out["blocks"] = capture(tiny_klein, root / "bad.difir", folder, "blocks")
    return out


def _report(args: list[str]) -> dict[str, Any]:
    result = invoke([*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    validate_document(doc)
    return doc["data"]  # type: ignore[no-any-return]


def test_injected_divergence_is_found_at_the_perturbed_op(runs: dict[str, Any]) -> None:
    bad: Program = runs["bad"]
    data = _report(
        ["bisect", "program", str(runs["bad_difir"]), "--capture", str(runs["ops"])] + ["--reference", str(runs["ref"])]
    )
    target = bad.node_by_id[runs["op_id"]].result.name
    order = [r.name for n in bad.nodes for r in n.results]
    assert data["verdict"] == "diverged"
    assert data["first_failed"] == target
    assert data["first_failed_op"]["op_id"] == runs["op_id"] and data["first_failed_op"]["opcode"] == "sdpa"
    assert data["last_passed"] == order[order.index(target) - 1]
    assert data["unobserved_between"] == []
    rows = {b["name"]: b for b in data["boundaries"]}
    assert rows[target]["status"] == "failed" and rows[target]["broken"]  # rel_l2 breaks its bar (cosine may not)
    assert all(rows[n]["status"] == "passed" for n in order[: order.index(target)])  # everything before agrees


def test_block_captures_do_not_blame_what_they_did_not_see(runs: dict[str, Any]) -> None:
    bad: Program = runs["bad"]
    data = _report(
        ["bisect", "program", str(runs["bad_difir"]), "--capture", str(runs["blocks"])]
        + ["--reference", str(runs["ref"]), "--max-rel-l2", "1e-3"]  # the block absorbs most of it: 2e-3 at its end
    )
    target = bad.node_by_id[runs["op_id"]].result.name
    rows = {b["name"]: b for b in data["boundaries"]}
    assert rows[target]["status"] == "not observed"  # the perturbed op was inside a block
    assert target in data["unobserved_between"]
    first = rows[data["first_failed"]]
    assert first["status"] == "failed" and first["op_id"] > runs["op_id"]
    assert rows[data["last_passed"]]["status"] == "passed" and rows[data["last_passed"]]["op_id"] < runs["op_id"]
    assert all(rows[n]["status"] == "not observed" for n in data["unobserved_between"])


def test_capture_of_another_program_is_refused(runs: dict[str, Any], tiny_klein: dict[str, Any]) -> None:
    result = invoke(
        ["bisect", "program", str(tiny_klein["difir"]), "--capture", str(runs["ops"]), "--reference", str(runs["ref"])]
    )
    assert result.exit_code == 1 and "not " in result.output and "Traceback" not in result.output


def test_pairs_in_capture_order(runs: dict[str, Any]) -> None:
    data = _report(["bisect", "pairs", str(runs["blocks"]), str(runs["ref"]), "--max-rel-l2", "1e-3"])
    assert data["verdict"] == "diverged" and data["unobserved_between"] == []
    assert data["order_source"].startswith("capture order")


def test_oracle_manifest_protocol(runs: dict[str, Any], tmp_path: Path) -> None:
    from dif.bisect.fixtures import load_capture, write_manifest

    ref = load_capture(runs["ref"])
    names = list(ref.order)
    picked = [names[3], names[10], names[-1]]
    tensors = {f"oracle.{i}": ref.tensors[n].astype("float32") for i, n in enumerate(picked)}
    bounds = [{"name": f"b{i}", "tensor": f"oracle.{i}", "dif": n} for i, n in enumerate(picked)]
    bounds.insert(1, {"name": "seen-by-oracle-only", "tensor": "oracle.0", "dif": None})
    manifest = write_manifest(tmp_path / "fixture.json", tensors, bounds, {"library": "test", "version": "0"})
    data = _report(["bisect", "validate-oracle", str(manifest)])
    assert [b["name"] for b in data["boundaries"]] == ["b0", "seen-by-oracle-only", "b1", "b2"]
    rep = _report(["bisect", "manifest", str(manifest), "--capture", str(runs["ref"])])
    assert rep["verdict"] == "agree"
    assert next(b for b in rep["boundaries"] if b["name"] == "seen-by-oracle-only")["status"] == "not observed"
    rep = _report(["bisect", "manifest", str(manifest), "--capture", str(runs["ops"]), "--max-rel-l2", "1e-3"])
    assert rep["verdict"] == "diverged" and rep["first_failed"] == "b2" and rep["last_passed"] == "b1"

    doc = json.loads(manifest.read_text())
    doc["boundaries"][2]["tensor"] = "oracle.missing"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    for cmd in (
        ["bisect", "validate-oracle", str(broken)],
        ["bisect", "manifest", str(broken), "--capture", str(runs["ref"])],
    ):
        result = invoke(cmd)
        assert result.exit_code == 1 and "oracle.missing" in result.output and "Traceback" not in result.output


def test_bad_capture_setting_is_refused(tiny_klein: dict[str, Any], tmp_path: Path) -> None:
    args = ["run", str(tiny_klein["difir"]), "--inputs", str(tiny_klein["inputs_path"]), "--backend", "cpu"]
    args += ["--weights", str(tiny_klein["weights_path"]), "--out", str(tmp_path / "out.diftensor")]
    result = invoke(args, env={"DIF_CAPTURE": "everything", "DIF_CAPTURE_DIR": str(tmp_path / "cap")})
    assert result.exit_code == 1 and "DIF_CAPTURE" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out.diftensor").exists() and not (tmp_path / "cap").exists()
    plain = tmp_path / "plain.safetensors"
    from dif.serialize.diftensor import save_tensors

    save_tensors(plain, {"a": tiny_klein["inputs"]["latents"]})
    result = invoke(["bisect", "program", str(tiny_klein["difir"]), "--capture", str(plain), "--reference", str(plain)])
    assert result.exit_code == 1 and "not a dif capture" in result.output
