"""perf/formats_h200.py (issue 17's H200 measurements) on miniatures with torch CPU and dif's CPU backend: both
phases run and write what the GPU call will report, so a mistake is found before device time is spent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.oracle
def test_tiny_cpu_run_of_both_phases(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    cmd = [sys.executable, str(REPO / "perf" / "formats_h200.py"), "--tiny", "--models", "klein-4b",
           "--formats", "fp8-e4m3,int4-group", "--iters", "1", "--runs", "1"]  # fmt: skip
    env = {**__import__("os").environ, "OUT": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = json.loads((tmp_path / "step_klein-4b-tiny.json").read_text())
    assert set(step["formats"]) == {"bf16", "fp8-e4m3", "int4-group"}
    for fmt, r in step["formats"].items():
        assert "error" not in r, (fmt, r)
        assert r["ms"] > 0 and r["vs_diffusers_eager"]["cosine"] > 0.99
    assert step["formats"]["fp8-e4m3"]["vs_dif_bf16"]["cosine"] > 0.995
    assert any("quantize_fp8: applied" in d for d in step["formats"]["fp8-e4m3"]["pass_decisions"])
    assert step["formats"]["int4-group"]["param_bytes"] < step["formats"]["bf16"]["param_bytes"]
    pipe = json.loads((tmp_path / "pipeline_klein-4b-tiny.json").read_text())
    gate = pipe["formats"]["fp8-e4m3"]["gate"]
    assert gate["passed"] and len(gate["steps"]) == 4 and gate["ssim"] > 0.9
    assert not pipe["formats"]["int4-group"]["gate"]["passed"]  # random weights, groups of 64: rejected
    assert pipe["formats"]["bf16"]["total_s"] > 0
    assert list(tmp_path.glob("pipeline_klein-4b-tiny_bf16_vs_fp8-e4m3_vs_int4-group.jpg"))
