"""fp8 checkpoints: ComfyUI scaled fp8 (weights x `scale_weight` / `weight_scale`, scalar or per row)
dequantized to bf16 with the scale tensors hidden and a note; plain fp8 left for bind to widen, and
`--dtype auto` picks bf16 for an fp8 file (it holds every fp8 value exactly)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from dif.checkpoint import storage_dtype
from dif.dtypes import DType
from dif.errors import DifWarning, WeightError
from dif.serialize.diftensor import save_tensors
from dif.weights import open_safetensors
from dif.weights.fp8 import ScaledFp8Source, scaled_fp8

E4M3 = ml_dtypes.float8_e4m3fn


def test_scaled_fp8_dequantizes_and_hides_scales(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 4)).astype(E4M3)
    w2 = rng.standard_normal((6, 4)).astype(E4M3)
    s1 = np.array(0.0123, np.float32)
    s2 = (rng.random(6) + 0.5).astype(np.float32)
    norm = rng.standard_normal(4).astype(np.float32)
    path = tmp_path / "m.safetensors"
    tensors = {
        "scaled_fp8": np.zeros(0, E4M3),
        "a.weight": w1,
        "a.scale_weight": s1,
        "a.scale_input": np.array(1.0, np.float32),
        "b.weight": w2,
        "b.weight_scale": s2,
        "n.weight": norm,
    }
    save_tensors(path, tensors, dif_metadata=False)
    with pytest.warns(DifWarning, match="2 scaled fp8 weights are dequantized to bf16"):
        src = scaled_fp8(open_safetensors(path))
    assert isinstance(src, ScaledFp8Source)
    assert sorted(src.names()) == ["a.weight", "b.weight", "n.weight"]
    assert src.info("a.weight").dtype == "BF16" and src.info("n.weight").dtype == "F32"
    want1 = (w1.astype(np.float32) * s1).astype(ml_dtypes.bfloat16)
    want2 = (w2.astype(np.float32) * s2[:, None]).astype(ml_dtypes.bfloat16)
    assert np.array_equal(src["a.weight"].view(np.uint16), want1.view(np.uint16))
    assert np.array_equal(src["b.weight"].view(np.uint16), want2.view(np.uint16))
    assert np.array_equal(src["n.weight"], norm)
    assert "x 'a.scale_weight'" in src.file_of("a.weight")
    assert storage_dtype(src) == DType.BF16


def test_scale_of_the_wrong_size(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_tensors(
        path,
        {"a.weight": np.ones((4, 4), E4M3), "a.scale_weight": np.ones(3, np.float32)},
        dif_metadata=False,
    )
    with pytest.warns(DifWarning):
        src = scaled_fp8(open_safetensors(path))
    with pytest.raises(WeightError, match=r"'a.scale_weight' in .*m.safetensors has 3 values"):
        src["a.weight"]


def test_plain_fp8_runs_in_bf16(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    tensors = {"a.weight": np.ones((4, 4), E4M3), "b.weight": np.ones((4, 4), E4M3), "n.weight": np.ones(4, np.float32)}
    save_tensors(path, tensors, dif_metadata=False)
    with pytest.warns(DifWarning, match="2 fp8 tensors are widened to the run dtype"):
        src = scaled_fp8(open_safetensors(path))
    assert src.info("a.weight").dtype == "F8_E4M3"
    assert storage_dtype(src) == DType.BF16  # was f32: fp8 was not a run dtype
