"""Plugin loading and collection: in-process plugins, a fake installed distribution, failures recorded.

Every test runs inside `isolated_plugins`, so plugins installed on this machine do not leak in.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import dif
from dif.backend import Availability, BackendInfo
from dif.errors import PluginError
from dif.formats import FormatRegistry, PhysicalFormat, Usage
from dif.frontend import FrontendInfo
from dif.ops.registry import OpDef, OpTable
from dif.plugins import (
    add_commands,
    backends,
    frontends,
    isolated_plugins,
    load_plugins,
    passes,
    physical_formats,
    plugin_ops,
    plugin_records,
    pm,
    problems,
    register_plugin,
    registrations,
)


@pytest.fixture(autouse=True)
def _clean():
    with isolated_plugins(""):
        yield


def _backend(name: str, priority: int = 0, ok: bool = True) -> BackendInfo:
    return BackendInfo(name, priority, f"fake {name}", lambda: Availability(ok, "" if ok else "no device"), object)


class BackendPlugin:
    def __init__(self, *infos: BackendInfo) -> None:
        self.infos = infos

    @dif.hookimpl
    def register_backends(self, register):
        for info in self.infos:
            register(info)


def test_in_process_backend_is_collected_and_recorded():
    register_plugin(BackendPlugin(_backend("fake")), "fakeplug")
    assert list(backends()) == ["fake"]
    (record,) = plugin_records()
    assert record.name == "fakeplug"
    assert record.source == "in-process"
    assert record.hooks == ("register_backends",)
    assert record.error is None
    assert registrations() == {"fakeplug": {"backends": ["fake"]}}


def test_duplicate_backend_name_is_a_plugin_error_on_the_later_plugin():
    register_plugin(BackendPlugin(_backend("same")), "a_first")
    register_plugin(BackendPlugin(_backend("same")), "b_second")
    assert list(backends()) == ["same"]
    by_name = {r.name: r for r in plugin_records()}
    assert by_name["a_first"].error is None
    assert "already registered by plugin 'a_first'" in by_name["b_second"].error
    assert any(isinstance(p, PluginError) and "b_second" in str(p) for p in problems())
    with pytest.raises(PluginError, match="already registered"):
        backends(strict=True)


def test_hook_that_raises_is_recorded_and_others_still_count():
    class Exploding:
        @dif.hookimpl
        def register_backends(self, register):
            raise RuntimeError("boom")

    register_plugin(Exploding(), "exploding")
    register_plugin(BackendPlugin(_backend("good")), "good")
    assert list(backends()) == ["good"]
    record = {r.name: r for r in plugin_records()}["exploding"]
    assert "RuntimeError: boom" in record.error


def test_wrong_registered_type_is_reported():
    class WrongType:
        @dif.hookimpl
        def register_backends(self, register):
            register("not a BackendInfo")

    register_plugin(WrongType(), "wrong")
    assert backends() == {}
    assert "expects a BackendInfo" in plugin_records()[0].error


def test_misspelled_hookimpl_is_rejected_by_check_pending():
    class Misspelled:
        @dif.hookimpl
        def register_backend(self, register):  # missing the final "s"
            register(_backend("never"))

    with pytest.raises(PluginError, match="register_backend"):
        register_plugin(Misspelled(), "typo")
    assert pm.get_plugin("typo") is None
    assert backends() == {}


def test_register_plugin_refuses_a_taken_name():
    register_plugin(BackendPlugin(), "taken")
    with pytest.raises(PluginError, match="already registered"):
        register_plugin(BackendPlugin(), "taken")


def test_frontends_passes_ops_formats_and_commands_are_collected():
    opdef = OpDef("plugin_double", "x*2", ("x",), (), lambda t: t, lambda x: x * 2, None)
    fmt = PhysicalFormat(
        name="int3-test", description="test", storage_dtype="u8", bits=3, usage=Usage.HOOK_ONLY, usage_reason="test"
    )
    calls: list[object] = []

    def my_pass(program):
        return program

    class Everything:
        @dif.hookimpl
        def register_frontends(self, register):
            register(FrontendInfo("famx", "test family", detect=lambda p: False))

        @dif.hookimpl
        def register_passes(self, register):
            register("noop_pass", my_pass)

        @dif.hookimpl
        def register_ops(self, register):
            register(opdef)

        @dif.hookimpl
        def register_physical_formats(self, register):
            register(fmt)

        @dif.hookimpl
        def register_commands(self, cli):
            calls.append(cli)

    register_plugin(Everything(), "everything")
    assert list(frontends()) == ["famx"]
    assert passes() == {"noop_pass": my_pass}
    table = OpTable()
    assert plugin_ops(table) == {"plugin_double": opdef}
    assert table.get("plugin_double") is opdef
    formats = FormatRegistry()
    assert physical_formats(formats) == {"int3-test": fmt}
    assert formats.get("int3-test") is fmt
    sentinel = object()
    add_commands(sentinel)
    assert calls == [sentinel]
    hooks = plugin_records()[0].hooks
    assert set(hooks) == {
        "register_frontends",
        "register_passes",
        "register_ops",
        "register_physical_formats",
        "register_commands",
    }


def test_plugin_op_clashing_with_a_table_op_is_reported():
    existing = OpDef("clash", "one", ("x",), (), lambda t: t, lambda x: x, None)
    table = OpTable()
    table.register(existing)
    other = OpDef("clash", "two", ("x",), (), lambda t: t, lambda x: x, None)

    class Clash:
        @dif.hookimpl
        def register_ops(self, register):
            register(other)

    register_plugin(Clash(), "clash")
    plugin_ops(table)
    assert table.get("clash") is existing
    assert "already registered" in plugin_records()[0].error
    with pytest.raises(PluginError):
        plugin_ops(table, strict=True)


def test_register_commands_that_raises_is_not_fatal():
    class BadCommands:
        @dif.hookimpl
        def register_commands(self, cli):
            raise ValueError("no click here")

    register_plugin(BadCommands(), "badcmd")
    add_commands(object())
    assert "ValueError: no click here" in plugin_records()[0].error


# -- installed distributions (a fake dist-info on sys.path) ----------------------------------------

_GOOD = """
import dif
from dif.backend import Availability, BackendInfo

LOADS = []
LOADS.append(1)

@dif.hookimpl
def register_backends(register):
    register(BackendInfo("tmpgood", 5, "from a dist-info", lambda: Availability(True), object))
"""
_BROKEN = "raise ImportError('this plugin needs a library that is not installed')\n"
_MISSPELT = """
import dif

@dif.hookimpl
def register_backendz(register):
    pass
"""


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution 'dif-fake-plugins' exposing entry points good / broken / misspelt."""
    for module, source in (("dif_fake_good", _GOOD), ("dif_fake_broken", _BROKEN), ("dif_fake_misspelt", _MISSPELT)):
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    info = tmp_path / "dif_fake_plugins-0.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dif-fake-plugins\nVersion: 0.3.0\n")
    (info / "entry_points.txt").write_text(
        "[dif]\ngood = dif_fake_good\nbroken = dif_fake_broken\nmisspelt = dif_fake_misspelt\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in ("dif_fake_good", "dif_fake_broken", "dif_fake_misspelt"):
        sys.modules.pop(module, None)


def test_entry_points_load_failures_are_recorded_not_fatal(fake_dist, monkeypatch):
    monkeypatch.setenv("DIF_LOAD_PLUGINS", "good,broken,misspelt")
    records = {r.name: r for r in load_plugins()}
    assert set(records) == {"good", "broken", "misspelt"}
    good = records["good"]
    assert (good.distribution, good.version, good.source, good.error) == (
        "dif-fake-plugins",
        "0.3.0",
        "entry point",
        None,
    )
    assert "import failed: ImportError: this plugin needs a library" in records["broken"].error
    assert "unknown hook implementation" in records["misspelt"].error
    assert "register_backendz" in records["misspelt"].error
    assert pm.get_plugin("misspelt") is None  # unregistered after check_pending rejected it
    assert list(backends()) == ["tmpgood"]


def test_dif_load_plugins_selects_a_subset(fake_dist, monkeypatch):
    monkeypatch.setenv("DIF_LOAD_PLUGINS", "good")
    assert [r.name for r in load_plugins()] == ["good"]
    assert "dif_fake_broken" not in sys.modules


def test_dif_load_plugins_empty_loads_nothing(fake_dist, monkeypatch):
    monkeypatch.setenv("DIF_LOAD_PLUGINS", "")
    assert load_plugins() == []
    assert backends() == {}


def test_dif_load_plugins_naming_a_missing_plugin_is_reported(fake_dist, monkeypatch):
    monkeypatch.setenv("DIF_LOAD_PLUGINS", "good,nosuch")
    records = {r.name: r for r in load_plugins()}
    assert records["good"].error is None
    assert "no installed distribution" in records["nosuch"].error


def test_load_plugins_is_idempotent(fake_dist, monkeypatch):
    monkeypatch.setenv("DIF_LOAD_PLUGINS", "good")
    first = load_plugins()
    second = load_plugins()
    assert [r.name for r in first] == [r.name for r in second] == ["good"]
    assert sys.modules["dif_fake_good"].LOADS == [1]
    assert len([p for _, p in pm.list_name_plugin() if p is not None]) == 1


def test_isolated_plugins_restores_previous_state():
    register_plugin(BackendPlugin(_backend("outer")), "outer")
    with isolated_plugins(""):
        assert backends() == {}
        register_plugin(BackendPlugin(_backend("inner")), "inner")
        assert list(backends()) == ["inner"]
    assert list(backends()) == ["outer"]
    assert pm.get_plugin("inner") is None
