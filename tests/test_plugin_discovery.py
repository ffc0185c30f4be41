"""Plugins found through real installed entry points (install.sh installs every distribution)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dif.backend import BackendInfo
from dif.plugins import backends, isolated_plugins, load_plugins, plugin_records, registrations
from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def test_cpu_backend_is_discovered_through_its_entry_point():
    with isolated_plugins(None):
        records = {r.name: r for r in load_plugins()}
        assert "cpu" in records, f"no 'cpu' entry point among {sorted(records)}: run ./install.sh"
        cpu = records["cpu"]
        assert (cpu.distribution, cpu.source, cpu.error) == ("dif-backend-cpu", "entry point", None)
        assert "register_backends" in cpu.hooks
        info = backends()["cpu"]
        assert isinstance(info, BackendInfo)
        assert info.is_available().ok


def test_every_installed_plugin_loads_registers_and_adds_commands_cleanly():
    with isolated_plugins(None):
        load_plugins()
        registrations()  # every collector: duplicates and hook exceptions become errors
        build_cli().add_plugin_commands()
        broken = {r.name: r.error for r in plugin_records() if r.error}
        assert broken == {}


def test_dif_load_plugins_subset_with_real_entry_points():
    with isolated_plugins("cpu"):
        assert [r.name for r in load_plugins()] == ["cpu"]
        assert list(backends()) == ["cpu"]
    with isolated_plugins(""):
        assert load_plugins() == []
        assert backends() == {}


def test_dif_plugins_json_lists_cpu():
    with isolated_plugins(None):
        result = CliRunner().invoke(build_cli(), ["plugins", "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        validate_document(doc)
        entries = {e["name"]: e for e in doc["data"]["plugins"]}
        assert entries["cpu"]["registers"]["backends"] == ["cpu"]
        assert [p["name"] for p in doc["provenance"]["plugins"]] == [r.name for r in plugin_records()]
