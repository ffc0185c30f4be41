"""docs/hooks.md's complete minimal backend, exactly as the page has it: its files are extracted from
the marked code blocks into a temporary distribution, its plugin module is registered in-process (as
its entry point would be), programs go through the normal selection path onto it (or past it, for an
op or dtype it lacks) and the conformance kit runs for the ops it declares."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import dif_backend_cpu.plugin
from dif.errors import BackendUnavailableError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.plugins import backends, isolated_plugins, register_plugin
from dif.program_cache import ProgramCache
from dif.runtime import get_backend
from dif.testing.conformance import declared_conformance

REPO = Path(__file__).resolve().parents[1]
HOOKS_MD = REPO / "docs" / "hooks.md"
BLOCK = re.compile(r"<!-- minimal-backend: (\S+) -->\n```\w+\n(.*?)\n```\n", re.S)
FILES = {
    "pyproject.toml",
    "mini_backend/__init__.py",
    "mini_backend/plugin.py",
    "mini_backend/device.py",
    "mini_backend/executor.py",
    "tests/test_conformance.py",
}
ALLOWED_IMPORTS = {"__future__", "collections", "os", "platform", "dif", "numpy", "pytest", "mini_backend"}
"""What the page's code may import: the standard library it uses, dif-core (with its numpy) and itself."""


def doc_files() -> dict[str, str]:
    found = BLOCK.findall(HOOKS_MD.read_text())
    files = dict(found)
    assert len(files) == len(found), "docs/hooks.md marks one file twice"
    return files


@pytest.fixture
def distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ModuleType]]:
    """(entry-point name, plugin module) of the page's distribution, importable from a temporary folder."""
    for path, text in doc_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text + "\n")
    entry_points = tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]["entry-points"]
    ((name, target),) = entry_points["dif"].items()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DIF_BACKEND", raising=False)
    try:
        with isolated_plugins(""):
            yield name, importlib.import_module(target)
    finally:
        for module in [m for m in sys.modules if m == "mini_backend" or m.startswith("mini_backend.")]:
            del sys.modules[module]


def _mlp(dtype: str = "f32") -> Program:
    b = ProgramBuilder("mlp")
    x = b.input("x", (3, 8), dtype)
    w1, w2 = b.param("w1", (16, 8), dtype), b.param("w2", (8, 16), dtype)
    h = b.emit("silu", b.emit("linear", x, w1))
    b.output(b.emit("softmax", b.emit("add", x, b.emit("linear", h, w2)), axis=-1))
    return b.build()


def _attention() -> Program:
    b = ProgramBuilder("attn")
    q = b.input("q", (1, 2, 4, 8), "f32")
    b.output(b.emit("sdpa", q, q, q))
    return b.build()


def _int_add() -> Program:
    b = ProgramBuilder("count")
    x = b.input("x", (4,), "i32")
    b.output(b.emit("add", x, x))
    return b.build()


def test_the_page_holds_a_whole_distribution_that_needs_only_dif_core() -> None:
    files = doc_files()
    assert set(files) == FILES
    project = tomllib.loads(files["pyproject.toml"])["project"]
    assert project["dependencies"] == ["dif-core>=0.1.0"]
    assert project["entry-points"]["dif"] == {"mini": "mini_backend.plugin"}
    for path, text in files.items():
        if not path.endswith(".py"):
            continue
        imported = {
            (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]  # type: ignore[union-attr]
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert imported <= ALLOWED_IMPORTS, f"{path} imports {sorted(imported - ALLOWED_IMPORTS)}"


def test_selection_runs_a_program_on_it_and_passes_it_by_for_an_op_or_dtype_it_lacks(distribution) -> None:
    name, plugin = distribution
    register_plugin(plugin, name)
    register_plugin(dif_backend_cpu.plugin, "cpu")
    info = backends()["mini"]
    assert info.declared_ops() == {"add", "mul", "silu", "linear", "softmax"}
    assert info.probe is not None and info.probe().dtypes == ("f32", "f16", "bf16")

    cache = ProgramCache()
    rng = np.random.default_rng(0)
    program = _mlp()
    weights = {p.name: rng.standard_normal(p.type.shape).astype(np.float32) for p in program.params}
    inputs = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    run = cache.get("mlp", lambda: (program, weights))
    assert cache.backend_name == "mini"
    (got,) = run(inputs).values()
    (want,) = interpret(program, inputs, weights).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    cache.get("attn", lambda: (_attention(), {}))
    assert cache.backend_name == "cpu"  # mini has no sdpa: the next backend by priority
    cache.get("count", lambda: (_int_add(), {}))
    assert cache.backend_name == "cpu"  # mini stores no i32
    with pytest.raises(BackendUnavailableError, match="backend 'mini' cannot run program 'attn': mini lacks op sdpa"):
        get_backend("mini", program=_attention())


def _load_test_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("mini_backend_conformance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_conformance_kit_passes_for_every_op_it_declares(distribution) -> None:
    name, plugin = distribution
    register_plugin(plugin, name)
    conformance = _load_test_module(Path(plugin.__file__).parents[1] / "tests" / "test_conformance.py")
    declared = plugin.INFO.declared_ops()
    ran: dict[str, set[str]] = {}
    for test in (conformance.test_op_matches_interpreter, conformance.test_op_matches_float64):
        (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
        for param in mark.args[1]:
            (case,) = param.values
            test(case)  # the page's own test body: assert_case / assert_float64, strict
            ran.setdefault(test.__name__, set()).add(case.op)
    assert ran == {"test_op_matches_interpreter": declared, "test_op_matches_float64": declared}

    report = declared_conformance(plugin.INFO, float64=True)
    assert report.passed and not report.unsupported, report.summary()
    assert {r.op for r in report.results} == declared
    assert {r.dtype.value for r in report.results} == {"f32", "bf16"}
