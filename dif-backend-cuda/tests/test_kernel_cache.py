"""The NVRTC cubin cache without a GPU (compilation replaced by a counter): one cubin per kernel, reused
only while its seal holds its checksum; a truncated or edited cubin, or an edited seal, is recompiled with
a warning. Asking for a kernel starts its compile on the pool and returns at once; only the kernels asked
for are compiled, each once."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.errors import BackendError, DifWarning
from dif_backend_cuda import kernels
from dif_backend_cuda.kernels import KernelCache, PendingKernel

KERNEL = "rms_norm_bf16_bf16"


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake_compile(source: str, arch: str, module: str, kernel: str) -> tuple[bytes, str]:
        assert "KERNEL_ENTRY" in source
        calls.append(kernel)
        return f"cubin of {kernel} for {arch} #{len(calls)}".encode(), f"_Z{len(kernel)}{kernel}ILi0EEv"

    monkeypatch.setattr(kernels, "compile_cubin", fake_compile)
    monkeypatch.setattr(kernels, "nvrtc_version", lambda: "nvrtc-13.0")
    return calls


def test_compiled_once_then_read_from_disk(tmp_path: Path, compiles: list[str]) -> None:
    path, lowered = KernelCache("sm_90", tmp_path).cubin("norm", KERNEL)
    assert compiles == [KERNEL] and path.read_bytes() == f"cubin of {KERNEL} for sm_90 #1".encode()
    fresh = KernelCache("sm_90", tmp_path)  # another process
    assert fresh.cubin("norm", KERNEL) == (path, lowered) and fresh.stats[f"norm:{KERNEL}"] == "disk"
    assert compiles == [KERNEL]
    KernelCache("sm_80", tmp_path).cubin("norm", KERNEL)  # another arch: its own entry
    KernelCache("sm_90", tmp_path).cubin("norm", "softmax_bf16")  # another kernel: its own entry
    assert compiles == [KERNEL, KERNEL, "softmax_bf16"]


def test_asking_returns_at_once_and_compiles_each_kernel_once(tmp_path: Path, compiles: list[str]) -> None:
    cache = KernelCache("sm_90", tmp_path)
    first = cache.function("norm", KERNEL)
    assert isinstance(first, PendingKernel) and cache.function("norm", KERNEL) is first
    other = cache.function("elementwise", "unary_silu_bf16")
    assert isinstance(other, PendingKernel)
    assert first._cubin is not None and other._cubin is not None
    assert first._cubin.result()[1].endswith(f"{KERNEL}ILi0EEv") and other._cubin.result()
    assert sorted(compiles) == [KERNEL, "unary_silu_bf16"]  # nothing else of either module


def test_an_unknown_module_is_refused_when_asked(tmp_path: Path, compiles: list[str]) -> None:
    with pytest.raises(BackendError, match="no kernel module 'nope'"):
        KernelCache("sm_90", tmp_path).function("nope", KERNEL)
    assert compiles == []


@pytest.mark.parametrize("damage", ["truncate", "edit cubin", "edit seal", "drop seal"])
def test_a_damaged_entry_is_recompiled_with_a_warning(tmp_path: Path, compiles: list[str], damage: str) -> None:
    path, _ = KernelCache("sm_90", tmp_path).cubin("layout", "strided_copy_u16")
    seal = path.with_name(path.name + ".seal")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:5])
    elif damage == "edit cubin":
        path.write_bytes(path.read_bytes().replace(b"#1", b"#9"))
    elif damage == "edit seal":
        seal.write_bytes(seal.read_bytes()[:-4] + b"0000")
    else:
        seal.unlink()
    cache = KernelCache("sm_90", tmp_path)
    with pytest.warns(DifWarning):
        cache.cubin("layout", "strided_copy_u16")
    assert cache.stats["layout:strided_copy_u16"] == "compiled" and compiles == ["strided_copy_u16"] * 2
    assert path.read_bytes() == b"cubin of strided_copy_u16 for sm_90 #2"
    assert KernelCache("sm_90", tmp_path).cubin("layout", "strided_copy_u16")[0] == path
    assert compiles == ["strided_copy_u16"] * 2
