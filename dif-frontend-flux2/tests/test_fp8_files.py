"""ComfyUI scaled fp8 and plain fp8 FLUX.2 transformer files render end to end: on a backend that does not
execute fp8 (the CPU reference emulates it) a scaled fp8 file (per-tensor `scale_weight`, `scale_input`, the
`scaled_fp8` marker) gives the pixels of the same dequantized weights stored as plain bf16, with a note naming
the backend; on one with fp8 matrix units (the CPU backend claiming them here) the denoiser gets quantize_fp8
over the stored bytes, recorded in the run's settings and plan, without the note."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif.testing.backends import backend_skip_reason
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
# the CPU backend named: on a GPU machine the default one executes fp8 and the notes below would not be given
COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "2", "--steps", "2", "--backend", "cpu", "--dtype", "f32"]
E4M3 = ml_dtypes.float8_e4m3fn


def render(model: Path, out: Path) -> tuple[np.ndarray, str]:
    from PIL import Image

    args = ["flux2", "generate", "-m", str(model), "--base", str(DEFAULT_CHECKPOINT), *COMMON, "-o", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB")), result.output


def test_scaled_fp8_file_renders_like_its_dequantized_weights(tmp_path: Path, bfl_tensors) -> None:  # type: ignore[no-untyped-def]
    weights = bfl_tensors(DEFAULT_CHECKPOINT / "transformer")
    scaled: dict[str, np.ndarray] = {"scaled_fp8": np.zeros(0, E4M3)}
    dequantized: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        if w.ndim == 2 and name.endswith(".weight"):
            s = np.float32(np.abs(w).max() / 448.0)
            q = (w / s).astype(E4M3)
            scaled[name] = q
            scaled[name[: -len(".weight")] + ".scale_weight"] = np.array(s, np.float32)
            scaled[name[: -len(".weight")] + ".scale_input"] = np.array(1.0, np.float32)
            dequantized[name] = (q.astype(np.float32) * s).astype(ml_dtypes.bfloat16)
        else:
            scaled[name] = dequantized[name] = w
    assert len(dequantized) > 20
    fp8 = tmp_path / "klein-fp8-scaled.safetensors"
    save_tensors(fp8, scaled, dif_metadata=False)
    ref = tmp_path / "klein-bf16.safetensors"
    save_tensors(ref, dequantized, dif_metadata=False)
    image, said = render(fp8, tmp_path / "a.png")
    assert "warning:" in said and "fp8 weights are dequantized to f32: backend 'cpu' does not execute fp8-e4m3" in said
    assert np.array_equal(image, render(ref, tmp_path / "b.png")[0])


def test_plain_fp8_file_runs_in_bf16(tmp_path: Path, bfl_tensors) -> None:  # type: ignore[no-untyped-def]
    weights = {
        n: (w.astype(E4M3) if w.ndim == 2 else w) for n, w in bfl_tensors(DEFAULT_CHECKPOINT / "transformer").items()
    }
    path = tmp_path / "klein-fp8.safetensors"
    save_tensors(path, weights, dif_metadata=False)
    args = ["flux2", "generate", "-m", str(path), "--base", str(DEFAULT_CHECKPOINT), *COMMON[:-2], "--json"]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "o.png")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["data"]["settings"]["dtype"] == "bf16"
    assert "fp8 weights are dequantized to bf16: backend 'cpu' does not execute fp8-e4m3" in result.stderr
    (what,) = doc["data"]["settings"]["fp8_weights"].values()
    assert what.endswith("dequantized to bf16")


def fp8_matrix_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU backend's profile with fp8-e4m3 matrix units: it then counts as executing fp8-e4m3 (it runs
    the quantized ops' references, which the reference interpreter defines)."""
    from attrs import evolve

    device = pytest.importorskip("dif_backend_cpu.device", reason="the CPU backend is another distribution")
    profile = device.CpuBackend.profile
    monkeypatch.setattr(
        device.CpuBackend, "profile", lambda self: evolve(profile(self), tensor_core_formats=("fp8-e4m3",))
    )


def per_row_scaled_file(folder: Path, bfl_tensors) -> Path:  # type: ignore[no-untyped-def]
    """The embedded transformer as a scaled fp8 file with per-row `weight_scale`s whose amax sits off 448,
    so that re-quantizing the stored bytes would change them."""
    scaled: dict[str, np.ndarray] = {"scaled_fp8": np.zeros(0, E4M3)}
    for name, w in bfl_tensors(DEFAULT_CHECKPOINT / "transformer").items():
        if w.ndim == 2 and name.endswith(".weight"):
            s = (np.abs(w).max(axis=1) / 300.0).astype(np.float32)
            scaled[name] = (w / s[:, None]).astype(E4M3)
            scaled[name[: -len(".weight")] + ".weight_scale"] = s
        else:
            scaled[name] = w
    path = folder / "klein-fp8-scaled.safetensors"
    save_tensors(path, scaled, dif_metadata=False)
    return path


def test_an_fp8_file_keeps_fp8_where_the_backend_executes_it(  # type: ignore[no-untyped-def]
    tmp_path: Path, bfl_tensors, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = per_row_scaled_file(tmp_path, bfl_tensors)
    fp8_matrix_units(monkeypatch)
    args = ["flux2", "generate", "-m", str(path), "--base", str(DEFAULT_CHECKPOINT), *COMMON[:-2], "--json"]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "o.png")])
    assert result.exit_code == 0, result.output
    assert "fp8" not in result.stderr  # no note: kept
    doc = json.loads(result.stdout)
    (what,) = doc["data"]["settings"]["fp8_weights"].values()
    assert what.endswith("kept as stored (fp8-e4m3)") and int(what.split()[0]) > 0

    monkeypatch.setenv("DIF_FP8_WEIGHTS", "dequantize")  # the opt-out
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert "fp8 weights are dequantized to f32: DIF_FP8_WEIGHTS=dequantize" in result.stderr


# -- on CUDA: the same scaled file keeps fp8 through cuBLASLt's fp8 path over the stored bytes and scales, and
# draws the image the CPU backend draws with the same fp8 arithmetic emulated by the quantized ops'
# references; widened to bf16 (DIF_FP8_WEIGHTS=dequantize) only the activations' fp8 rounding is gone.
# Skips with the reason where CUDA cannot run.

CUDA_ARGS = ["-p", "a fox", "-W", "64", "-H", "64", "--seed", "3", "--steps", "2", "--json"]


def render_on(model: Path, out: Path, backend: str) -> tuple[np.ndarray, dict, str]:  # type: ignore[type-arg]
    from PIL import Image

    args = ["flux2", "generate", "-m", str(model), "--base", str(DEFAULT_CHECKPOINT), *CUDA_ARGS]
    result = CliRunner().invoke(cli, [*args, "--backend", backend, "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"), np.float64), json.loads(result.stdout), result.stderr


@pytest.mark.cuda
def test_scaled_fp8_file_runs_fp8_on_cuda(tmp_path: Path, bfl_tensors, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")
    path = per_row_scaled_file(tmp_path, bfl_tensors)

    kept, doc, said = render_on(path, tmp_path / "cuda.png", "cuda")
    assert "fp8 weights are dequantized" not in said
    (what,) = doc["data"]["settings"]["fp8_weights"].values()
    assert what.endswith("kept as stored (fp8-e4m3)") and int(what.split()[0]) > 0

    fp8_matrix_units(monkeypatch)  # the CPU backend emulating the same fp8 arithmetic
    emulated, _, _ = render_on(path, tmp_path / "cpu.png", "cpu")
    monkeypatch.setenv("DIF_FP8_WEIGHTS", "dequantize")
    widened, _, said = render_on(path, tmp_path / "bf16.png", "cuda")
    assert "fp8 weights are dequantized to f32: DIF_FP8_WEIGHTS=dequantize" in said  # widened: no bf16 kept

    vs_emulated = np.abs(kept - emulated)
    # the CUDA fp8 GEMM and the reference differ only in accumulation order and bf16 rounding of partial
    # results: a level or two in a few pixels
    assert vs_emulated.mean() < 1.0 and vs_emulated.max() <= 16, (vs_emulated.mean(), vs_emulated.max())
    # widening the weights removes the activations' fp8 rounding only: the picture stays the same one
    assert np.abs(kept - widened).mean() < 6.0
    assert not np.array_equal(kept, widened)  # ... but it is another computation
