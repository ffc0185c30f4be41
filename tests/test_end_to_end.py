"""The `dif` command on the real CPU backend: probe, formats-table and the shipped example program."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.interp import interpret
from dif.plugins import isolated_plugins
from dif.serialize.difir import load_program
from dif.serialize.diftensor import load_tensors
from dif.telemetry import validate_document
from dif_tools.cli import build_cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture
def dif_cli():
    with isolated_plugins(None):
        runner = CliRunner()

        def invoke(*args: str) -> dict:
            result = runner.invoke(build_cli(), [*args, "--json"], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            doc = json.loads(result.stdout)
            validate_document(doc)
            return doc

        yield invoke


def test_probe_json_has_the_cpu_profile_and_budget(dif_cli):
    doc = dif_cli("probe")
    cpu = next(h for h in doc["hardware"] if h["backend"] == "cpu")
    assert cpu["available"] is True
    assert "f32" in cpu["profile"]["dtypes"]
    assert cpu["profile"]["memory_bytes"] > 0
    assert doc["runtime_budget"]["cpu"]["free_memory_bytes"] > 0


def test_formats_table_json_on_cpu(dif_cli):
    doc = dif_cli("formats-table", "--backend", "cpu")
    rows = {r["format"]: r for r in doc["data"]["tables"]["cpu"]}
    assert rows["fp32"]["legal"] and rows["fp32"]["searchable"]
    assert set(rows) >= {"fp32", "bf16", "fp16", "fp8-e4m3", "int8", "int4-group"}


def _expected_mlp() -> np.ndarray:
    program = load_program(EXAMPLES / "mlp.difir")
    inputs, _ = load_tensors(EXAMPLES / "mlp-inputs.safetensors")
    weights, _ = load_tensors(EXAMPLES / "mlp-weights.safetensors")
    (reference,) = interpret(program, inputs, weights).values()
    x = inputs["x"].astype(np.float64)
    h = x @ weights["fc1.weight"].T + weights["fc1.bias"]
    h = h / (1 + np.exp(-h))
    by_hand = h @ weights["fc2.weight"].T + weights["fc2.bias"]
    np.testing.assert_allclose(reference, by_hand, rtol=1e-5, atol=1e-5)
    return reference


def test_dif_run_example_matches_the_reference(dif_cli, tmp_path):
    out = tmp_path / "y.safetensors"
    doc = dif_cli(
        "run",
        str(EXAMPLES / "mlp.difir"),
        "--inputs",
        str(EXAMPLES / "mlp-inputs.safetensors"),
        "--weights",
        str(EXAMPLES / "mlp-weights.safetensors"),
        "--out",
        str(out),
        "--backend",
        "cpu",
    )
    assert doc["data"]["backend"] == "cpu"
    assert doc["hardware"][0]["backend"] == "cpu"
    assert any(e["name"] == "run" and e["ms"] >= 0 for e in doc["events"])
    (got,) = load_tensors(out)[0].values()
    np.testing.assert_allclose(got, _expected_mlp(), rtol=1e-6, atol=1e-6)


def test_inspect_example(dif_cli):
    data = dif_cli("inspect", str(EXAMPLES / "mlp.difir"))["data"]
    assert data["ops"] == {"linear": 2, "silu": 1}
    assert data["params"]["count"] == 32 * 16 + 32 + 8 * 32 + 8
    assert data["provenance"]["modules"] == ["mlp"]


def test_example_files_are_what_make_example_writes(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "make_example.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("mlp.difir", "mlp-inputs.safetensors", "mlp-weights.safetensors"):
        assert (tmp_path / name).read_bytes() == (EXAMPLES / name).read_bytes(), f"regenerate examples/{name}"


def _quickstart() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("## Quickstart", 1)[1].split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip() and not line.lstrip().startswith("#")]


def test_readme_quickstart_is_two_commands_and_ci_runs_the_same_tests():
    commands = _quickstart()
    assert len(commands) == 2, commands
    assert commands[0].startswith("./dif "), "the main job runs through the repo's launcher"
    assert commands[1] in (REPO / ".ci" / "run").read_text().splitlines(), "CI must run the README's test command"
    for launcher in ("dif", commands[1].split()[0].removeprefix("./")):
        assert os.access(REPO / launcher, os.X_OK), f"{launcher} is not executable"


def test_readme_main_job_runs(tmp_path):
    """The README's main job, exactly as written, except that its output lands in the test's folder."""
    main_job = shlex.split(_quickstart()[0])
    assert main_job[:3] == ["./dif", "flux2", "generate"], main_job
    # ./dif execs the `dif` console script of .venv; run the one of the environment running the tests.
    exe = shutil.which("dif", path=str(Path(sys.executable).parent)) or shutil.which("dif")
    assert exe, "the dif console script is not installed: run ./dif-test (or ./install.sh)"
    args = list(main_job[1:])
    out = tmp_path / Path(args[args.index("-o") + 1]).name
    args[args.index("-o") + 1] = str(out)
    proc = subprocess.run([exe, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    from PIL import Image

    with Image.open(out) as img:
        assert img.format == "PNG" and img.size[0] >= 256
        assert "parameters" in img.info
