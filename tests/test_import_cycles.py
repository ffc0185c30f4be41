"""No import cycles in the src packages: the import graph of every module under `*/src/` is read with `ast`
(nothing is imported to build it) and must be acyclic at module level everywhere; inside a backend
package it must stay acyclic even counting the imports written inside functions (a lowering used to
import its own registry's modules from `lower_node`). The GPU backends' modules must also import on a
machine without the GPU, pulling in no device library."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("dif_backend_cpu", "dif_backend_cuda", "dif_backend_opencl")
DEVICE_LIBRARIES = ("cupy", "cudnn", "nvmath", "cuda", "pyopencl")


def src_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of every distribution's `src/`."""
    out: dict[str, Path] = {}
    for src in sorted(REPO.glob("*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _import_statements(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """(import statement, written inside a function?) for the module; `if TYPE_CHECKING:` bodies are
    skipped (they never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for stmt in node.orelse:
                yield from _import_statements(ast.Module(body=[stmt], type_ignores=[]), in_function)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function
        nested = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        yield from _import_statements(node, nested)


def imports_of(name: str, path: Path, modules: dict[str, Path], with_functions: bool) -> set[str]:
    """The src modules `name` imports (a `from pkg import sub` of a submodule counts as that submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for stmt, in_function in _import_statements(ast.parse(path.read_text(encoding="utf-8"))):
        if in_function and not with_functions:
            continue
        if isinstance(stmt, ast.Import):
            found.update(a.name for a in stmt.names if a.name in modules)
            continue
        assert isinstance(stmt, ast.ImportFrom)
        base = stmt.module or ""
        if stmt.level:
            parent = package.split(".")[: len(package.split(".")) - stmt.level + 1]
            base = ".".join([*parent, *([stmt.module] if stmt.module else [])])
        for alias in stmt.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _describe(comps: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "; ".join(" , ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in comps)


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_written_inside_functions() -> None:
    modules = src_modules()
    name = "dif_backend_cuda.plugin"
    lazy = imports_of(name, modules[name], modules, with_functions=True)
    assert "dif_backend_cuda.device" in lazy and "dif_backend_cuda.lower" in lazy
    assert "dif_backend_cuda.device" not in imports_of(name, modules[name], modules, with_functions=False)


def test_no_module_level_import_cycle_in_any_src_package() -> None:
    modules = src_modules()
    assert len(modules) > 100
    graph = {m: imports_of(m, p, modules, with_functions=False) for m, p in modules.items()}
    comps = cycles(graph)
    assert not comps, f"module-level import cycles: {_describe(comps, graph)}"


@pytest.mark.parametrize("package", BACKENDS)
def test_no_import_cycle_in_a_backend_even_through_function_level_imports(package: str) -> None:
    modules = {m: p for m, p in src_modules().items() if m == package or m.startswith(package + ".")}
    assert modules, f"no modules of {package} under */src"
    graph = {m: imports_of(m, p, modules, with_functions=True) for m, p in modules.items()}
    comps = cycles(graph)
    assert not comps, f"import cycles in {package}: {_describe(comps, graph)}"


@pytest.mark.parametrize("package", ["dif_backend_cuda", "dif_backend_opencl"])
def test_gpu_backend_modules_import_without_a_device_library(package: str) -> None:
    """Every module imports in a fresh interpreter, and none of them imports cupy / pyopencl / cuDNN:
    those come only inside functions, when a device is used."""
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        "names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.')]\n"
        "for n in names: importlib.import_module(n)\n"
        f"print(len(names), sorted(m for m in {DEVICE_LIBRARIES!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(None, 1)
    assert int(out[0]) >= 10 and out[1].strip() == "[]", out
