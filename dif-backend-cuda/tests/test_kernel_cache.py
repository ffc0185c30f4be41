"""The NVRTC cubin cache without a GPU (compilation replaced by a counter): a cubin is reused only while
its seal holds its checksum; a truncated or edited cubin, or an edited seal, is recompiled with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.errors import DifWarning
from dif_backend_cuda import kernels
from dif_backend_cuda.kernels import KernelCache, module_source


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake_compile(source: str, arch: str, name: str) -> bytes:
        calls.append(name)
        return f"cubin of {name} for {arch} #{len(calls)}".encode()

    monkeypatch.setattr(kernels, "compile_cubin", fake_compile)
    return calls


def test_compiled_once_then_read_from_disk(tmp_path: Path, compiles: list[str]) -> None:
    source = module_source("norm")
    path = KernelCache("sm_90", tmp_path).cubin("norm", source)
    assert compiles == ["norm"] and path.read_bytes() == b"cubin of norm for sm_90 #1"
    fresh = KernelCache("sm_90", tmp_path)  # another process
    assert fresh.cubin("norm", source) == path and fresh.stats["norm"] == "disk"
    assert compiles == ["norm"]
    KernelCache("sm_80", tmp_path).cubin("norm", source)  # another arch: its own entry
    assert compiles == ["norm", "norm"]


@pytest.mark.parametrize("damage", ["truncate", "edit cubin", "edit seal", "drop seal"])
def test_a_damaged_entry_is_recompiled_with_a_warning(tmp_path: Path, compiles: list[str], damage: str) -> None:
    source = module_source("layout")
    path = KernelCache("sm_90", tmp_path).cubin("layout", source)
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
        cache.cubin("layout", source)
    assert cache.stats["layout"] == "compiled" and compiles == ["layout", "layout"]
    assert path.read_bytes() == b"cubin of layout for sm_90 #2"
    assert KernelCache("sm_90", tmp_path).cubin("layout", source) == path and compiles == ["layout", "layout"]
