"""Repository-wide rules checked by reading the source: import layering, DIF_* variables declared in
one place, every distribution laid out alike and installed by install.sh."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from dif import env

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = sorted(p.name for p in REPO.glob("dif-*") if (p / "src").is_dir())
ORACLES = {"torch", "diffusers", "transformers"}
DEVICE_LIBS = {"cupy", "pyopencl", "nvmath", "cudnn", "cuda"}
CLICK_BUILDER = REPO / "dif-core" / "src" / "dif" / "kit" / "commands.py"  # the one dif-core module importing click


def _package(dist: str) -> str:
    return dist.replace("-", "_") if dist != "dif-core" else "dif"


def _sources(dist: str) -> list[Path]:
    return sorted((REPO / dist / "src").rglob("*.py"))


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level?) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    module_level = {id(n) for n in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` / try blocks at module level count as module level
        if isinstance(node, ast.If | ast.Try):
            module_level.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], id(node) in module_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], id(node) in module_level))
    return found


def _forbidden(dist: str) -> set[str]:
    """Top-level packages `dist` may never import (ARCHITECTURE.md: one direction)."""
    others = {_package(d) for d in DISTRIBUTIONS} - {_package(dist), "dif"}
    if dist == "dif-core":
        return others | ORACLES | {"click"}
    if dist.startswith("dif-frontend-"):
        return {p for p in others if p.startswith("dif_backend_")} | {"dif_tools"} | ORACLES
    if dist.startswith("dif-backend-"):
        return {p for p in others if p.startswith(("dif_frontend_", "dif_backend_"))} | {"dif_tools"} | ORACLES
    return others | ORACLES  # dif-tools reaches backends and frontends only through plugins


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_import_layering(dist):
    bad = []
    for path in _sources(dist):
        for module, at_top in _imports(path):
            if module in _forbidden(dist) and not (module == "click" and path == CLICK_BUILDER):
                bad.append(f"{path.relative_to(REPO)} imports {module}")
            elif module in DEVICE_LIBS and at_top:
                bad.append(f"{path.relative_to(REPO)} imports {module} at module level (import it inside a function)")
    assert bad == []


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_distribution_layout(dist):
    assert (REPO / dist / "pyproject.toml").is_file(), f"{dist}/pyproject.toml is missing"
    meta = tomllib.loads((REPO / dist / "pyproject.toml").read_text())
    assert meta["project"]["name"] == dist
    package = REPO / dist / "src" / _package(dist)
    assert (package / "__init__.py").is_file(), f"{dist} needs src/{package.name}/__init__.py"
    assert (package / "py.typed").is_file(), f"{dist} needs src/{package.name}/py.typed"
    assert (REPO / dist / "README.md").is_file() or dist == "dif-core"
    if dist != "dif-core":
        assert any(dep.startswith("dif-core") for dep in meta["project"]["dependencies"])
    for group, entries in meta["project"].get("entry-points", {}).items():
        assert group == "dif", f"{dist}: plugins use only the 'dif' entry-point group"
        for target in entries.values():
            assert target.startswith(_package(dist) + "."), f"{dist}: entry point {target} outside its package"


def test_install_script_installs_every_distribution():
    script = (REPO / "install.sh").read_text()
    listed = re.search(r"DISTRIBUTIONS=\((.*?)\)", script, re.S)
    assert listed is not None
    assert sorted(listed.group(1).split()) == DISTRIBUTIONS
    assert '"torch==2.13.0"' in script, "torch must stay pinned to the CPU wheel on disk"
    assert "set -euo pipefail" in script


def test_pytest_testpaths_cover_every_distribution():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert set(config["testpaths"]) == {f"{d}/tests" for d in DISTRIBUTIONS} | {"tests"}


def test_dif_env_vars_are_declared_in_dif_env():
    """Every DIF_* name in any src/ file is declared in dif/env.py; nothing reads DIF_* via os.environ."""
    declared = set(env.ENV_VARS)
    problems = []
    for dist in DISTRIBUTIONS:
        for path in _sources(dist):
            text = path.read_text()
            for name in sorted(set(re.findall(r"\bDIF_[A-Z][A-Z0-9_]*\b", text)) - declared):
                problems.append(f"{path.relative_to(REPO)}: {name} is not declared in dif/env.py")
            if path.name != "env.py" and re.search(r"(environ(\.get)?|getenv)\(?\[?\s*['\"]DIF_", text):
                problems.append(f"{path.relative_to(REPO)}: reads a DIF_* variable directly; use dif.env")
    assert problems == []
