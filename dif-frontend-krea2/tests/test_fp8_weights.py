"""A Krea 2 folder whose transformer linears are stored as plain fp8-e4m3: on a backend with fp8 matrix units (the
CPU backend claiming them here) the denoiser and the text fusion keep the stored bytes (quantize_fp8, recorded in
the run's settings); on the plain CPU backend they run dequantized, with a note naming the backend."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import load_tensors, save_tensors
from dif_frontend_krea2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
device = pytest.importorskip("dif_backend_cpu.device", reason="the CPU backend is another distribution")


@pytest.fixture
def fp8_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "krea2-fp8"
    shutil.copytree(DEFAULT_CHECKPOINT, folder)
    file = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors, _ = load_tensors(file)
    fp8 = {
        n: w.astype(ml_dtypes.float8_e4m3fn) if w.ndim == 2 and n.endswith(".weight") else w for n, w in tensors.items()
    }
    save_tensors(file, fp8, dif_metadata=False)
    return folder


def generate(folder: Path, out: Path) -> tuple[dict, str]:
    args = ["krea2", "generate", "-m", str(folder), "-p", "a fox", "-W", "64", "-H", "64", "--steps", "2",
            "--seed", "1", "--backend", "cpu", "--json", "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_fp8_weights_are_kept_where_executed_else_dequantized(
    fp8_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, said = generate(fp8_folder, tmp_path / "a.png")
    notes = doc["data"]["settings"]["fp8_weights"]
    assert notes and all("dequantized" in v for v in notes.values())
    assert "backend 'cpu' does not execute fp8-e4m3" in said

    from attrs import evolve

    from dif.passes import quantize

    # the tiny model's linears are all narrower than the quantize_rows threshold, which tests/test_quant_passes.py
    # covers; here every one may take the stored bytes
    monkeypatch.setattr(quantize, "ROWS_PASS_MIN_OUT", 1)
    profile = device.CpuBackend.profile
    monkeypatch.setattr(
        device.CpuBackend, "profile", lambda self: evolve(profile(self), tensor_core_formats=("fp8-e4m3",))
    )
    doc, said = generate(fp8_folder, tmp_path / "b.png")
    kept = doc["data"]["settings"]["fp8_weights"]
    assert {"krea2_denoiser", "krea2_text_fusion"} <= set(kept)
    assert all(v.endswith("kept as stored (fp8-e4m3)") and int(v.split()[0]) > 0 for v in kept.values()), kept
    assert "does not execute fp8" not in said
