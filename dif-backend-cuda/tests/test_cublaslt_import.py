"""`gemm.cublaslt_binding` imports nvmath's cuBLASLt binding without nvmath's package __init__ (which
imports its whole library stack, about a second per process), and leaves `import nvmath` working for
others. Checked on a stand-in nvmath package, so it runs on any machine."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from dif_backend_cuda.gemm import cublaslt_binding


@pytest.fixture
def fake_nvmath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "nvmath"
    (pkg / "bindings").mkdir(parents=True)
    # like nvmath's: counts its runs, then imports its layers (here only the bindings)
    init = "import builtins\nbuiltins.NVMATH_INIT_RUNS += 1\nfrom nvmath import bindings  # noqa\n"
    (pkg / "__init__.py").write_text(init)
    (pkg / "bindings" / "__init__.py").write_text("")
    (pkg / "bindings" / "cublasLt.py").write_text("def get_version():\n    return 120900\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "nvmath" or m.startswith("nvmath.")]:
        monkeypatch.delitem(sys.modules, name)
    import builtins

    monkeypatch.setattr(builtins, "NVMATH_INIT_RUNS", 0, raising=False)
    yield pkg
    for name in [m for m in sys.modules if m == "nvmath" or m.startswith("nvmath.")]:
        del sys.modules[name]


def test_the_binding_imports_without_the_package_init(fake_nvmath: Path) -> None:
    import builtins

    lib = cublaslt_binding()
    assert lib.get_version() == 120900
    assert builtins.NVMATH_INIT_RUNS == 0
    assert "nvmath" not in sys.modules and "nvmath.bindings.cublasLt" in sys.modules

    nvmath = importlib.import_module("nvmath")  # someone else's full import still runs the real __init__
    assert builtins.NVMATH_INIT_RUNS == 1
    from nvmath.bindings import cublasLt

    assert cublasLt is lib
    assert cublaslt_binding() is lib  # nvmath imported: the ordinary import path
    assert nvmath.bindings.cublasLt is lib


def test_missing_nvmath_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.delitem(sys.modules, "nvmath", raising=False)
    with pytest.raises(ImportError, match="nvmath-python is not installed"):
        cublaslt_binding()
