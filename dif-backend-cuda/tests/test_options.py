"""Kernel-path and tuning options of the cuda backend (`gemm`, `sdpa`, `tune`) and their variables
DIF_CUDA_GEMM / DIF_CUDA_SDPA / DIF_CUDA_TUNE. Everything here runs without a GPU: it exercises `resolve_options`, which
`CudaBackend.__init__` calls before it looks for a device."""

from __future__ import annotations

import pytest

from dif.env import ENV_VARS
from dif.errors import UsageError
from dif_backend_cuda.device import GEMM_CHOICES, SDPA_CHOICES, CudaBackend, resolve_options


@pytest.fixture(autouse=True)
def _no_option_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's shell may set these; each test starts from "unset".
    monkeypatch.delenv("DIF_CUDA_GEMM", raising=False)
    monkeypatch.delenv("DIF_CUDA_SDPA", raising=False)
    monkeypatch.delenv("DIF_CUDA_TUNE", raising=False)
    monkeypatch.delenv("DIF_CUDA_INT4", raising=False)
    monkeypatch.delenv("DIF_CUDA_ROWS", raising=False)


def test_variables_are_declared_with_auto_default():
    assert ENV_VARS["DIF_CUDA_GEMM"].default == "auto"
    assert ENV_VARS["DIF_CUDA_SDPA"].default == "auto"
    assert ENV_VARS["DIF_CUDA_TUNE"].default == "cached"
    assert ENV_VARS["DIF_CUDA_INT4"].default == "mma"
    assert ENV_VARS["DIF_CUDA_ROWS"].default == "registers"


def test_unset_means_auto():
    assert resolve_options() == {"gemm": "auto", "sdpa": "auto", "tune": "cached", "int4": "mma", "rows": "registers"}


@pytest.mark.parametrize("gemm", GEMM_CHOICES)
@pytest.mark.parametrize("sdpa", SDPA_CHOICES)
def test_every_choice_is_accepted_from_the_environment(monkeypatch, gemm, sdpa):
    monkeypatch.setenv("DIF_CUDA_GEMM", gemm)
    monkeypatch.setenv("DIF_CUDA_SDPA", sdpa)
    assert resolve_options() == {"gemm": gemm, "sdpa": sdpa, "tune": "cached", "int4": "mma", "rows": "registers"}


def test_environment_values_ignore_case_and_spaces_and_empty_means_unset(monkeypatch):
    monkeypatch.setenv("DIF_CUDA_GEMM", " NVRTC ")
    monkeypatch.setenv("DIF_CUDA_SDPA", "")
    assert resolve_options() == {"gemm": "nvrtc", "sdpa": "auto", "tune": "cached", "int4": "mma", "rows": "registers"}


def test_explicit_argument_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("DIF_CUDA_GEMM", "cublaslt")
    monkeypatch.setenv("DIF_CUDA_SDPA", "cudnn")
    assert resolve_options(gemm="nvrtc", sdpa="flash") == {
        "gemm": "nvrtc",
        "sdpa": "flash",
        "tune": "cached",
        "int4": "mma",
        "rows": "registers",
    }
    assert resolve_options(gemm="nvrtc") == {
        "gemm": "nvrtc",
        "sdpa": "cudnn",
        "tune": "cached",
        "int4": "mma",
        "rows": "registers",
    }


@pytest.mark.parametrize("tune", ["cached", "on", "off"])
def test_tune_from_the_environment_and_argument(monkeypatch, tune):
    monkeypatch.setenv("DIF_CUDA_TUNE", tune)
    assert resolve_options()["tune"] == tune
    assert resolve_options(tune="off")["tune"] == "off"


@pytest.mark.parametrize("rows", ["staged", "registers"])
def test_row_kernels_from_the_environment_and_argument(monkeypatch, rows):
    monkeypatch.setenv("DIF_CUDA_ROWS", rows)
    assert resolve_options()["rows"] == rows
    assert resolve_options(rows="staged")["rows"] == "staged"


@pytest.mark.parametrize("int4", ["tile", "mma"])
def test_int4_kernel_from_the_environment_and_argument(monkeypatch, int4):
    monkeypatch.setenv("DIF_CUDA_INT4", int4)
    assert resolve_options()["int4"] == int4
    assert resolve_options(int4="tile")["int4"] == "tile"


@pytest.mark.parametrize(
    ("var", "allowed"),
    [
        ("DIF_CUDA_GEMM", "auto, cublaslt, nvrtc"),
        ("DIF_CUDA_SDPA", "auto, cudnn, flash"),
        ("DIF_CUDA_TUNE", "cached, on, off"),
        ("DIF_CUDA_INT4", "tile, mma"),
    ],
)
def test_bad_environment_value_names_the_variable_and_the_choices(monkeypatch, var, allowed):
    monkeypatch.setenv(var, "cutlass")
    with pytest.raises(UsageError) as info:
        resolve_options()
    message = str(info.value)
    assert f"{var}='cutlass'" in message
    assert allowed in message


def test_bad_argument_names_the_option_and_the_choices():
    with pytest.raises(UsageError, match=r"gemm='cutlass'(.|\n)*auto, cublaslt, nvrtc"):
        resolve_options(gemm="cutlass")
    with pytest.raises(UsageError, match=r"sdpa='xformers'(.|\n)*auto, cudnn, flash"):
        resolve_options(sdpa="xformers")


def test_backend_creation_reports_a_bad_value_before_looking_for_a_device(monkeypatch):
    """The error comes when the backend is made (not when the plugin is imported), and a typo is
    reported as such even on a machine without a GPU, rather than hidden behind "no device"."""
    monkeypatch.setenv("DIF_CUDA_SDPA", "nope")
    with pytest.raises(UsageError, match="DIF_CUDA_SDPA"):
        CudaBackend()
