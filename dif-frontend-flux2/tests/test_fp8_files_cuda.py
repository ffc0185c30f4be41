"""A ComfyUI-style scaled fp8 FLUX.2 transformer file on CUDA keeps its weights fp8: the run's settings say
so, the denoiser's linears run through cuBLASLt's fp8 path over the stored bytes and scales, and the image
is the one the CPU backend draws with the same fp8 arithmetic emulated by the quantized ops' references
(the CPU backend claims fp8 units for that). Against the weights widened to bf16 on CUDA
(`DIF_FP8_WEIGHTS=dequantize`) the image differs only by the activations' fp8 rounding. Skips with the
reason where CUDA cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
pytestmark = pytest.mark.cuda
ARGS = ["-p", "a fox", "-W", "64", "-H", "64", "--seed", "3", "--steps", "2", "--json"]


def _cuda_skip() -> str | None:
    try:
        from dif_backend_cuda.device import cuda_availability
    except ImportError as exc:
        return f"dif-backend-cuda is not installed ({exc})"
    avail = cuda_availability()
    return None if avail.ok else avail.reason


def render(model: Path, out: Path, backend: str) -> tuple[np.ndarray, dict, str]:  # type: ignore[type-arg]
    from PIL import Image

    args = ["flux2", "generate", "-m", str(model), "--base", str(DEFAULT_CHECKPOINT), *ARGS]
    result = CliRunner().invoke(cli, [*args, "--backend", backend, "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        return np.asarray(im.convert("RGB"), np.float64), json.loads(result.stdout), result.stderr


def test_scaled_fp8_file_runs_fp8_on_cuda(tmp_path: Path, bfl_tensors, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    if (why := _cuda_skip()) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")
    scaled: dict[str, np.ndarray] = {"scaled_fp8": np.zeros(0, ml_dtypes.float8_e4m3fn)}
    for name, w in bfl_tensors(DEFAULT_CHECKPOINT / "transformer").items():
        if w.ndim == 2 and name.endswith(".weight"):
            s = (np.abs(w).max(axis=1) / 300.0).astype(np.float32)  # per row, amax off 448: no re-quantization
            scaled[name] = (w / s[:, None]).astype(ml_dtypes.float8_e4m3fn)
            scaled[name[: -len(".weight")] + ".weight_scale"] = s
        else:
            scaled[name] = w
    path = tmp_path / "klein-fp8-scaled.safetensors"
    save_tensors(path, scaled, dif_metadata=False)

    kept, doc, said = render(path, tmp_path / "cuda.png", "cuda")
    assert "fp8 weights are dequantized" not in said
    (what,) = doc["data"]["settings"]["fp8_weights"].values()
    assert what.endswith("kept as stored (fp8-e4m3)") and int(what.split()[0]) > 0

    from test_fp8_files import fp8_matrix_units

    fp8_matrix_units(monkeypatch)  # the CPU backend emulating the same fp8 arithmetic
    emulated, _, _ = render(path, tmp_path / "cpu.png", "cpu")
    monkeypatch.setenv("DIF_FP8_WEIGHTS", "dequantize")
    widened, _, said = render(path, tmp_path / "bf16.png", "cuda")
    assert "fp8 weights are dequantized to bf16: DIF_FP8_WEIGHTS=dequantize" in said

    vs_emulated = np.abs(kept - emulated)
    # the CUDA fp8 GEMM and the reference differ only in accumulation order and bf16 rounding of partial
    # results: a level or two in a few pixels
    assert vs_emulated.mean() < 1.0 and vs_emulated.max() <= 16, (vs_emulated.mean(), vs_emulated.max())
    # widening the weights removes the activations' fp8 rounding only: the picture stays the same one
    assert np.abs(kept - widened).mean() < 6.0
    assert not np.array_equal(kept, widened)  # ... but it is another computation
