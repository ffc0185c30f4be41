"""dif-backend-cpu registers through the `dif` entry point exactly as a third-party backend would."""

from __future__ import annotations

import tomllib
from pathlib import Path

import dif_backend_cpu.plugin as plugin
from dif.backend import BackendInfo
from dif.plugins import backends, isolated_plugins, register_plugin
from dif_backend_cpu import CpuBackend

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_entry_point_is_declared() -> None:
    meta = tomllib.loads(PYPROJECT.read_text())["project"]
    assert meta["entry-points"]["dif"] == {"cpu": "dif_backend_cpu.plugin"}
    assert any(dep.startswith("dif-core") for dep in meta["dependencies"])


def test_plugin_registers_the_cpu_backend() -> None:
    with isolated_plugins(""):
        register_plugin(plugin, "cpu")
        info = backends()["cpu"]
        assert isinstance(info, BackendInfo) and info is plugin.INFO
        assert info.is_available().ok
        backend = info.create()
        assert isinstance(backend, CpuBackend) and backend.name == "cpu"
