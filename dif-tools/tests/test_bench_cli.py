"""`dif bench`: the tiny CPU recipe end to end (a real `dif flux2 generate` in a fresh process, its PNG decoded,
the document valid), and refusals / failures with the stage named and exit status 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif_tools.cli import build_cli

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "perf" / "recipes" / "tiny-cpu.json"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(build_cli(), ["bench", *args], catch_exceptions=False)


def write_recipe(tmp_path: Path, stages: list[dict[str, Any]]) -> Path:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"kind": "dif-bench-recipe/1", "name": "t", "stages": stages}))
    return path


def test_tiny_cpu_recipe_end_to_end(tmp_path):
    pytest.importorskip("dif_frontend_flux2")
    work = tmp_path / "work"
    result = invoke(str(TINY), "--workdir", str(work), "--no-reference", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    assert doc["kind"] == "bench"
    assert json.loads((work / "bench.json").read_text()) == doc  # the same document, written atomically
    data = doc["data"]
    assert data["status"] == "ok"
    dif_run, reference = data["rounds"][0]
    assert reference["status"] == "skipped"
    assert dif_run["status"] == "ok" and dif_run["exit_status"] == 0
    (png,) = dif_run["outputs"]
    assert png["ok"] and png["verified"] and png["format"] == "png" and png["size"] == [64, 64]
    assert dif_run["telemetry"]["kind"] == "flux2.generate"  # the document dif printed, embedded
    assert dif_run["dif_reported"]["total_s"] <= dif_run["wall_s"]  # dif's own clock sees less than the user
    assert dif_run["residency"]["measured"] and 0.0 <= dif_run["residency"]["resident_fraction"] <= 1.0
    assert dif_run["rusage"]["user_s"] > 0 and dif_run["rusage"]["max_rss_bytes"] > 10 << 20
    assert data["summary"]["measured"]["median_s"] == dif_run["wall_s"]
    assert data["summary"]["ratio"] is None  # no reference ran


def test_table_output_and_repeat_medians(tmp_path):
    stages = [
        {"name": "m", "role": "measured", "argv": [sys.executable, "-c", "import time; time.sleep(0.05)"]},
        {"name": "r", "role": "reference", "argv": [sys.executable, "-c", "1"]},
    ]
    result = invoke(str(write_recipe(tmp_path, stages)), "--workdir", str(tmp_path / "w"), "--repeat", "3")
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "w" / "bench.json").read_text())
    walls = doc["data"]["summary"]["measured"]["walls_s"]
    assert len(walls) == 3 and doc["data"]["summary"]["measured"]["median_s"] == sorted(walls)[1]
    assert f"measured: median {sorted(walls)[1]:.3f} s" in result.stdout
    assert "measured / reference:" in result.stdout


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        (
            [
                {"name": "a", "role": "measured", "argv": [sys.executable, "-c", "1"], "depends_on": ["b"]},
                {"name": "b", "role": "setup", "argv": [sys.executable, "-c", "1"], "depends_on": ["a"]},
            ],
            "dependency cycle a -> b -> a",
        ),
        (
            [{"name": "a", "role": "measured", "argv": [sys.executable, "-c", "1"], "model_files": ["/nope/*.st"]}],
            "stage 'a'.model_files: nothing matches /nope/*.st",
        ),
        ([{"name": "a", "role": "measured", "argv": ["1"], "retries": 3}], "stage 'a': unknown key(s) 'retries'"),
    ],
)
def test_invalid_recipe_is_refused_before_any_stage_runs(tmp_path, stages, message):
    path = write_recipe(tmp_path, stages)
    result = invoke(str(path), "--workdir", str(tmp_path / "w"))
    assert result.exit_code == 1
    assert message in result.stderr and str(path) in result.stderr
    assert not (tmp_path / "w").exists()  # nothing ran, nothing written


def test_failing_stage_is_named_with_exit_status_and_stderr(tmp_path):
    broken = "import sys; print('no disk', file=sys.stderr); sys.exit(4)"
    stages = [
        {"name": "setup", "role": "setup", "argv": [sys.executable, "-c", broken]},
        {"name": "gen", "role": "measured", "argv": [sys.executable, "-c", "1"], "depends_on": ["setup"]},
    ]
    result = invoke(str(write_recipe(tmp_path, stages)), "--workdir", str(tmp_path / "w"), "--json")
    assert result.exit_code == 1
    assert "stage 'setup' failed in round 0: exit status 4" in result.stderr and "no disk" in result.stderr
    doc = json.loads(result.stdout)
    validate_document(doc)
    assert doc["data"]["status"] == "failed"
    assert [r["status"] for r in doc["data"]["rounds"][0]] == ["failed", "not run"]


@pytest.mark.oracle
@pytest.mark.slow
def test_tiny_cpu_recipe_with_the_diffusers_reference(tmp_path):
    pytest.importorskip("diffusers")
    pytest.importorskip("dif_frontend_flux2")
    result = invoke(str(TINY), "--workdir", str(tmp_path / "w"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)["data"]
    reference = data["rounds"][0][1]
    assert reference["status"] == "ok" and reference["outputs"][0]["size"] == [64, 64]
    s = data["summary"]
    assert s["ratio"] == round(s["measured"]["median_s"] / s["reference"]["median_s"], 4)


@pytest.mark.parametrize("recipe", sorted((REPO / "perf" / "recipes").glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_recipe_is_valid(recipe, tmp_path):
    pytest.importorskip("dif_frontend_flux2")
    pytest.importorskip("dif_frontend_krea2")
    from dif.bench import load_recipe

    loaded = load_recipe(recipe, tmp_path)  # executables, scripts and model files exist or are produced
    roles = {s.role for s in loaded.stages}
    assert "measured" in roles and "reference" in roles
    assert all(s.outputs for s in loaded.stages if s.role != "setup")  # every timed stage's file is checked
    for stage in loaded.stages:  # paths the argv names outside the workdir (configs, tokenizer files) exist
        outside = [a for a in stage.argv if a.startswith("/") and not a.startswith(str(loaded.workdir))]
        assert all(Path(a).exists() for a in outside), (stage.name, outside)


def test_drop_cache_evicts_the_declared_model_files(tmp_path):
    weights = tmp_path / "model" / "w.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"\0" * (1 << 20))
    stages = [{"name": "m", "role": "measured", "argv": [sys.executable, "-c", "1"], "model_files": [str(weights)]}]
    result = invoke(str(write_recipe(tmp_path, stages)), "--workdir", str(tmp_path / "w"), "--drop-cache", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)["data"]["rounds"][0][0]
    assert record["evicted_files"] == 1
    assert record["residency"]["measured"] and record["residency"]["bytes"] == 1 << 20
