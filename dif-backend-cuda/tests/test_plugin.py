"""The CUDA backend registers and reports itself on any machine, GPU or not, without crashing."""

from __future__ import annotations

import importlib
import sys

import pytest

from dif.backend import Availability, BackendInfo


def test_import_pulls_in_no_gpu_library() -> None:
    for name in [m for m in sys.modules if m.startswith("dif_backend_cuda")]:
        del sys.modules[name]
    before = {m for m in sys.modules if m.split(".")[0] in ("cupy", "nvmath", "cudnn", "cuda")}
    importlib.import_module("dif_backend_cuda")
    importlib.import_module("dif_backend_cuda.plugin")
    importlib.import_module("dif_backend_cuda.lower")
    after = {m for m in sys.modules if m.split(".")[0] in ("cupy", "nvmath", "cudnn", "cuda")}
    assert after == before


def test_plugin_registers_one_backend_info() -> None:
    from dif_backend_cuda import plugin

    got: list[BackendInfo] = []
    plugin.register_backends(got.append)
    assert [i.name for i in got] == ["cuda"]
    assert got[0].priority > 0  # preferred over the CPU reference when available


def test_availability_answers_with_a_reason_when_unusable() -> None:
    from dif_backend_cuda.plugin import INFO

    avail = INFO.is_available()
    assert isinstance(avail, Availability)
    if not avail.ok:
        assert avail.reason, "an unavailable backend must say why"


def test_create_without_gpu_raises_backend_unavailable() -> None:
    from dif.errors import BackendUnavailableError
    from dif_backend_cuda.device import cuda_availability
    from dif_backend_cuda.plugin import INFO

    if cuda_availability().ok:
        pytest.skip("a GPU is present here")
    with pytest.raises(BackendUnavailableError, match="cuda backend unavailable"):
        INFO.create()


def test_tensor_core_formats_follow_compute_capability() -> None:
    from dif_backend_cuda.device import tensor_core_formats

    assert "bf16" not in tensor_core_formats(7, 5)
    assert {"fp16", "bf16", "int8"} <= set(tensor_core_formats(8, 0))
    assert "fp8-e4m3" not in tensor_core_formats(8, 6)
    assert {"fp8-e4m3", "fp8-e5m2", "bf16"} <= set(tensor_core_formats(9, 0))
    from dif.formats import TENSOR_CORE_FORMATS

    assert set(tensor_core_formats(10, 0)) <= set(TENSOR_CORE_FORMATS)  # the names the format registry knows
