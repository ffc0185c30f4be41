"""The NaN / inf test of uploaded weights on the GPU (`weight_scan`, `prepare(nonfinite_check=...)`):
exactly the damaged tensors of every float width are flagged, a pipeline refuses a damaged checkpoint by
tensor name before the program runs, and a clean one runs (the host never scans it). Skipped without a GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import dif.weights.scan as scan
from dif.errors import WeightError
from dif.ir import ProgramBuilder
from dif.program_cache import ProgramCache
from dif.weights import ArraySource, bind_weights

from .conftest import cuda_skip_reason

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _gpu() -> None:
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_exactly_the_damaged_tensors_are_flagged(dtype: type) -> None:
    import cupy

    from dif.dtypes import dtype_of
    from dif_backend_cuda.kernels import KernelCache
    from dif_backend_cuda.lower import DevTensor
    from dif_backend_cuda.weight_scan import nonfinite_tensors

    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(3_000_001).astype(dtype) for name in ("clean", "nan", "inf", "neg_inf")}
    arrays["nan"][-1] = np.nan
    arrays["inf"][1_234_567] = np.inf
    arrays["neg_inf"][0] = -np.inf
    arrays["huge_but_finite"] = np.full(7, ml_dtypes.finfo(dtype).max, dtype)
    on_device = {name: cupy.asarray(a) for name, a in arrays.items()}
    tensors = [(n, DevTensor(int(a.data.ptr), a.shape, dtype_of(arrays[n]))) for n, a in on_device.items()]
    device = cupy.cuda.Device()
    kernels = KernelCache(f"sm_{device.compute_capability}")
    sms = int(device.attributes["MultiProcessorCount"])
    assert nonfinite_tensors(tensors, kernels, sms, cupy.cuda.Stream(non_blocking=True)) == {"nan", "inf", "neg_inf"}


def _program(name: str) -> object:
    b = ProgramBuilder(name)
    x = b.input("x", (4, 64), "bf16")
    w = b.param("w", (32, 64), "bf16")
    b.output(b.emit("linear", x, w))
    return b.build()


def test_a_pipeline_on_cuda_refuses_a_damaged_weight_by_name_and_runs_a_clean_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[str]] = []
    real = scan.nonfinite_counts
    monkeypatch.setattr(scan, "nonfinite_counts", lambda src, names: asked.append(list(names)) or real(src, names))
    w = np.ones((32, 64), ml_dtypes.bfloat16)
    bad = w.copy()
    bad[31, 63] = np.nan
    cache = ProgramCache(backend="cuda")
    damaged = ArraySource({"w": bad}, label="damaged.safetensors")
    with pytest.raises(WeightError, match=r"'w' in damaged.safetensors \(1 of 2048 values\)"):
        cache.get("bad", lambda: (_program("bad"), bind_weights(_program("bad"), damaged)))
    clean = ArraySource({"w": w}, label="clean.safetensors")
    runner = cache.get("good", lambda: (_program("good"), bind_weights(_program("good"), clean)))
    (out,) = runner({"x": np.ones((4, 64), ml_dtypes.bfloat16)}).values()
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.full((4, 32), 64.0, np.float32))
    assert asked == [["w"]]  # the host counted only the flagged tensor, for the message
    assert "scan_s" in cache.residency["good"]["prepare_s"]
