"""Meta-test: every hook spec is documented where declared, tested somewhere, and in docs/hooks.md;
every DIF_* variable declared in dif.env is in docs/env.md and nothing undeclared is."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from dif import env
from dif.errors import UsageError
from dif.plugins import hookspecs

REPO = Path(__file__).resolve().parents[2]
HOOKS_MD = REPO / "docs" / "hooks.md"
ENV_MD = REPO / "docs" / "env.md"


def _hookspec_names() -> list[str]:
    return sorted(
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if getattr(fn, "dif_spec", None) is not None
    )


def _test_sources() -> dict[Path, str]:
    files = [*REPO.glob("*/tests/**/*.py"), *REPO.glob("tests/**/*.py")]
    return {f: f.read_text() for f in files if f.resolve() != Path(__file__).resolve()}


def test_the_six_hooks_exist():
    assert _hookspec_names() == [
        "register_backends",
        "register_commands",
        "register_frontends",
        "register_ops",
        "register_passes",
        "register_physical_formats",
    ]


@pytest.mark.parametrize("name", _hookspec_names())
def test_hookspec_has_docstring(name):
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert len(doc.split()) >= 10, f"hookspec {name} needs a real docstring"


@pytest.mark.parametrize("name", _hookspec_names())
def test_hookspec_is_exercised_by_a_test(name):
    users = [p for p, text in _test_sources().items() if re.search(rf"\b{name}\b", text)]
    assert users, f"no test mentions hook {name}: add one that registers a plugin implementing it"


@pytest.mark.parametrize("name", _hookspec_names())
def test_hookspec_is_documented(name):
    text = HOOKS_MD.read_text()
    assert re.search(rf"^## {name}$", text, re.M), f"docs/hooks.md needs a '## {name}' section"


def test_docs_list_no_hook_that_does_not_exist():
    documented = re.findall(r"^## (register_\w+)$", HOOKS_MD.read_text(), re.M)
    assert sorted(documented) == _hookspec_names()


def test_every_declared_env_var_is_documented_and_only_those():
    documented = set(re.findall(r"`(DIF_[A-Z0-9_]+)`", ENV_MD.read_text()))
    declared = set(env.ENV_VARS)
    assert declared - documented == set(), "declared in dif/env.py but not in docs/env.md"
    assert documented - declared == set(), "in docs/env.md but not declared in dif/env.py"
    for var in env.ENV_VARS.values():
        assert var.doc, f"{var.name} needs a description"


def test_env_helpers(monkeypatch, tmp_path):
    monkeypatch.setenv("DIF_LOAD_PLUGINS", " a, b ,,")
    assert env.DIF_LOAD_PLUGINS.get_list() == ["a", "b"]
    monkeypatch.setenv("DIF_LOAD_PLUGINS", "")
    assert env.DIF_LOAD_PLUGINS.get_list() == []
    monkeypatch.delenv("DIF_LOAD_PLUGINS")
    assert env.DIF_LOAD_PLUGINS.get_list() is None
    monkeypatch.setenv("DIF_CACHE_DIR", str(tmp_path))
    assert env.cache_dir() == tmp_path
    monkeypatch.delenv("DIF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir() == tmp_path / "xdg" / "dif"
    with pytest.raises(ValueError, match="must start with DIF_"):
        env.declare("OTHER", "x")
    with pytest.raises(ValueError, match="declared twice"):
        env.declare("DIF_BACKEND", "x")


def test_env_bool(monkeypatch):
    var = env.EnvVar("DIF_TEST_ONLY_BOOL", "not declared; exercises get_bool")
    monkeypatch.setenv(var.name, "yes")
    assert var.get_bool() is True
    monkeypatch.setenv(var.name, "0")
    assert var.get_bool() is False
    monkeypatch.setenv(var.name, "perhaps")
    with pytest.raises(UsageError, match="not a boolean"):
        var.get_bool()
