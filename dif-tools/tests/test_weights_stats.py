"""`dif weights stats MODEL`: per tensor count, min, max, mean and NaN / inf counts, for a file, a
component folder or a diffusers folder, as a table or one dif-telemetry/1 document (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def _model(root: Path) -> tuple[np.ndarray, np.ndarray]:
    w = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0
    v = np.ones(6, np.float16)
    v[[1, 4]] = [np.nan, np.inf]
    (root / "transformer").mkdir(parents=True)
    (root / "vae").mkdir()
    (root / "tokenizer").mkdir()  # no weights: skipped
    save_tensors(root / "transformer" / "diffusion_pytorch_model.safetensors", {"w": w}, dif_metadata=False)
    save_tensors(root / "vae" / "diffusion_pytorch_model.safetensors", {"v": v}, dif_metadata=False)
    return w, v


def test_stats_of_a_diffusers_folder_as_json(tmp_path: Path) -> None:
    w, _ = _model(tmp_path)
    result = CliRunner().invoke(build_cli(), ["weights", "stats", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    assert doc["kind"] == "weights.stats" and doc["data"]["nonfinite_tensors"] == 1
    by_name = {t["name"]: t for t in doc["data"]["tensors"]}
    assert set(by_name) == {"transformer/w", "vae/v"}
    t = by_name["transformer/w"]
    assert (t["dtype"], t["shape"], t["count"], t["nan"], t["inf"]) == ("F32", [3, 4], 12, 0, 0)
    assert (t["min"], t["max"], t["mean"]) == (float(w.min()), float(w.max()), float(w.mean()))
    v = by_name["vae/v"]
    assert (v["nan"], v["inf"], v["min"], v["max"], v["mean"]) == (1, 1, 1.0, 1.0, 1.0)


def test_stats_table_of_one_file_names_the_non_finite_tensors(tmp_path: Path) -> None:
    _model(tmp_path)
    path = tmp_path / "vae" / "diffusion_pytorch_model.safetensors"
    result = CliRunner().invoke(build_cli(), ["weights", "stats", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["tensor", "dtype", "shape", "count", "min", "max", "mean", "nan", "inf"]
    assert lines[2].split() == ["v", "F16", "6", "6", "1", "1", "1", "1", "1"]
    assert lines[-1].startswith("1 tensors, 6 values: 1 hold NaN / infinite values (")


def test_a_folder_without_weights_is_one_error_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(build_cli(), ["weights", "stats", str(tmp_path)])
    assert result.exit_code == 1 and "no weights found" in result.output and "Traceback" not in result.output
