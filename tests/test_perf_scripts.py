"""perf/bench_denoiser.py and perf/pipeline_wall.py: the pieces that decide what a GPU run reports (option
checks, the entry-point shim the GPU machine needs, the summary lines), and one whole tiny CPU run (oracle).

These scripts spend scarce device time, so a mistake found here saves a device call."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PERF = REPO / "perf"


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("ml_dtypes")
    sys.path.insert(0, str(PERF))
    try:
        import bench_denoiser

        yield bench_denoiser
    finally:
        sys.path.remove(str(PERF))


@pytest.mark.parametrize("text", ["12 GQ", "GB", "0.1"])
def test_bad_vram_budget_is_a_usage_error(bench, text, capsys):
    """Sizes parse as the product's --vram-budget does (dif.cli_support.parse_byte_size), before any model."""
    with pytest.raises(SystemExit) as exc:
        bench.main(["--vram-budget", text])
    assert exc.value.code == 2
    assert "--vram-budget:" in capsys.readouterr().err


def test_entry_point_shim(tmp_path, monkeypatch):
    """Distributions that are not installed get metadata-only dist-info folders importlib.metadata finds."""
    pytest.importorskip("ml_dtypes")
    monkeypatch.syspath_prepend(str(PERF))
    import pipeline_wall

    repo = tmp_path / "repo"
    (repo / "dif-backend-zzz").mkdir(parents=True)
    (repo / "dif-backend-zzz" / "pyproject.toml").write_text(
        '[project]\nname = "dif-backend-zzz"\nversion = "0.3.0"\n\n'
        '[project.entry-points.dif]\nzzz_test = "dif_backend_zzz.plugin"\n'
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    added = pipeline_wall.ensure_entry_points(repo, tmp_path / "eps")
    assert added == ["zzz_test"]
    eps = {ep.name: ep for ep in metadata.entry_points(group="dif")}
    assert eps["zzz_test"].value == "dif_backend_zzz.plugin"
    assert eps["zzz_test"].dist.version == "0.3.0"
    assert str(tmp_path / "eps") in sys.path
    assert pipeline_wall.ensure_entry_points(repo, tmp_path / "eps2") == []  # visible now: nothing to add


def test_summary_lines(bench):
    """The table's lines read the JSON sections, including failed and skipped phases."""
    dif = {"ms": 100.0}
    assert "PlanError: no fit" in bench.budget_line({"vram_budget": "12GB", "error": "PlanError: no fit"}, dif)
    assert "skipped" in bench.budget_line({"skipped": "skipped: 10 s left"}, dif)
    stages = {"encode": 0.05, "step_1": 0.2, "step_2": 0.2, "decode": 0.08, "to_pixels": 0.02, "png": 0.1, "total": 0.7}
    run = {"stages_s": stages, "total_s": 0.7, "peak_gib": 34.8}
    pipeline = {"size": 1024, "steps": 2, "diffusers_eager": run, "dif": {"error": "BackendError: boom"},
                "ratios": {"dif_over_eager": None}}  # fmt: skip
    text = "\n".join(bench.pipeline_lines(pipeline))
    assert "steps 0.200 0.200 | decode 0.100" in text and "BackendError: boom" in text
    assert bench.ratios({"dif": {"ms": 50.0}, "diffusers_eager_ms": 100.0}) == {
        "dif_over_eager": 0.5,
        "dif_over_compile": None,
    }


@pytest.mark.oracle
@pytest.mark.slow
def test_tiny_cpu_run(tmp_path):
    """Every phase of one GPU call, on miniatures with torch CPU and dif's CPU backend."""
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    cmd = [sys.executable, str(PERF / "bench_denoiser.py"), "--models", "klein-9b", "--device", "cpu", "--tiny",
           "--iters", "1", "--no-variants", "--profile-iters", "0", "--vram-budget", "12GB", "--pipeline",
           "--pipeline-iters", "1", "--out-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "bench_klein-9b.json").read_text())
    budget = data["dif_budget"]
    assert budget["residency"]["streamed_params"] > 0, budget
    assert budget["identical_to_dif_unbudgeted"], budget
    pipe = data["pipeline"]
    assert pipe["token_ids_equal"]
    assert pipe["dif"]["vs_diffusers_eager_pixels"]["cosine"] > 0.99, pipe["dif"]
    assert {"encode", "step_1", "step_4", "decode", "png", "total"} <= set(pipe["dif"]["stages_s"])
    assert {"encode", "step_1", "step_4", "decode", "to_pixels", "png", "total"} <= set(
        pipe["diffusers_eager"]["stages_s"]
    )
    cli = json.loads((tmp_path / "pipeline_cli.json").read_text())
    assert cli["rc"] == 0 and cli["png"]["size"] == [256, 256], cli


@pytest.mark.parametrize(
    ("script", "option"),
    [
        ("probe_attention_gemm.py", "--parts"),
        ("probe_gemm_configs.py", "--budget-s"),
        ("probe_elementwise.py", "--out"),
        ("probe_triton_fused.py", "--out"),
        ("profile_vae.py", "--size"),
    ],
)
def test_probe_scripts_parse_their_options(script: str, option: str):
    """The probes parse their options without a GPU (they import torch/cupy/nvmath only to run)."""
    out = subprocess.run([sys.executable, str(PERF / script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert option in out.stdout
