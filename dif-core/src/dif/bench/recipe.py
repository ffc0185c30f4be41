"""Benchmark recipes ("dif-bench-recipe/1"): a JSON chain of stages, read and checked before anything runs.

Where it sits: the first step of `dif bench`; `dif.bench.runner` executes the `Recipe` made here. Every
problem (unknown key, bad type, unknown dependency, cycle, missing executable / model file) is a
`RecipeError` naming the recipe file and the stage and key, so nothing is started on a recipe that cannot run.

Placeholders in argv, env, outputs, model_files and produces: `{workdir}`, `{python}` (this interpreter),
`{repo}` (the nearest folder above the recipe holding a pyproject.toml, else the recipe's folder),
`{recipe_dir}`, `{pkg:NAME}` (folder of an importable package, found without importing it) and the
recipe's own `vars`; `{{` and `}}` are literal braces. Relative paths are relative to the workdir.
"""

from __future__ import annotations

import fnmatch
import glob
import importlib.util
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from dif.errors import UsageError

KIND = "dif-bench-recipe/1"
ROLES = ("setup", "measured", "reference")
Schema = Mapping[str, type | tuple[type, ...]]
RECIPE_KEYS: Schema = {"kind": str, "name": str, "description": str, "vars": dict, "stages": list}
STAGE_KEYS: Schema = {
    "name": str,
    "role": str,
    "description": str,
    "argv": list,
    "env": dict,
    "timeout_s": (int, float),
    "depends_on": list,
    "outputs": list,
    "model_files": list,
    "produces": list,
}
REQUIRED_STAGE_KEYS = ("name", "role", "argv")
DEFAULT_TIMEOUT_S = 600.0
STAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # it becomes part of log file names
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)(?::([A-Za-z0-9_.]+))?\}|[{}]")


class RecipeError(UsageError):
    """A benchmark recipe is malformed or cannot run here (names the file, stage and key)."""


@frozen
class Stage:
    """One child process of a recipe, with every placeholder already substituted.

    `outputs`, `produces` and `model_files` are absolute paths (model_files: glob patterns)."""

    name: str
    role: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    timeout_s: float
    depends_on: tuple[str, ...]
    outputs: tuple[str, ...]
    model_files: tuple[str, ...]
    produces: tuple[str, ...]
    description: str = ""


@frozen
class Recipe:
    """A checked recipe: stages in an order where every stage follows its dependencies (ties keep file order)."""

    path: Path
    name: str
    description: str
    workdir: Path
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def ancestors(self, name: str) -> set[str]:
        """Every stage `name` depends on, directly or not."""
        seen: set[str] = set()
        todo = list(self.stage(name).depends_on)
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo.extend(self.stage(dep).depends_on)
        return seen


def repo_root(recipe_path: Path) -> Path:
    """The nearest folder at or above the recipe's holding a pyproject.toml (the recipe's folder if none)."""
    for folder in (recipe_path.parent, *recipe_path.parent.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return recipe_path.parent


def package_dir(name: str) -> str | None:
    """Folder of an importable package, without importing it (None when it is not installed)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))))


def substitute(text: str, values: Mapping[str, str], where: Callable[[], str]) -> str:
    """Replace `{name}` / `{pkg:NAME}` in `text`; an unknown name or a lone brace is a RecipeError at `where()`."""

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        if token in ("{", "}"):
            raise RecipeError(f"{where()}: lone '{token}' in {text!r}", hint="write '{{' or '}}' for a literal brace")
        name, arg = m.group(1), m.group(2)
        if name == "pkg" and arg is not None:
            folder = package_dir(arg)
            if folder is None:
                raise RecipeError(f"{where()}: {{pkg:{arg}}}: package '{arg}' is not installed")
            return folder
        if arg is not None or name not in values:
            known = ", ".join(sorted({*values, "pkg:NAME"}))
            raise RecipeError(f"{where()}: unknown placeholder {token} in {text!r}", hint=f"known: {known}")
        return values[name]

    return PLACEHOLDER.sub(one, text)


def _type_name(expected: type | tuple[type, ...]) -> str:
    names = {str: "a string", list: "a list", dict: "an object", bool: "a boolean"}
    if isinstance(expected, tuple):
        return "a number"
    return names.get(expected, expected.__name__)


def _check_keys(obj: Mapping[str, Any], schema: Schema, where: str, required: Sequence[str]) -> None:
    unknown = sorted(set(obj) - set(schema))
    if unknown:
        raise RecipeError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}", hint=f"known: {', '.join(schema)}"
        )
    for key in required:
        if key not in obj:
            raise RecipeError(f"{where}: missing key '{key}'")
    for key, expected in schema.items():
        if key not in obj:
            continue
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise RecipeError(f"{where}.{key}: must be {_type_name(expected)}, got {type(value).__name__}")


def _strings(value: list[Any], where: str, *, non_empty: bool = False) -> list[str]:
    if non_empty and not value:
        raise RecipeError(f"{where}: must not be empty")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RecipeError(f"{where}[{i}]: must be a string, got {type(item).__name__}")
    return list(value)


def _absolute(path: str, workdir: Path) -> str:
    return str(Path(path) if os.path.isabs(path) else workdir / path)


def find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle as [a, b, ..., a], or None (`deps` maps a stage to the stages it depends on)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in deps.get(node, ()):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def dependency_order(names: Sequence[str], deps: Mapping[str, Sequence[str]]) -> list[str]:
    """`names` with every stage after its dependencies, otherwise in the given order (acyclic `deps`)."""
    done: list[str] = []
    while len(done) < len(names):
        ready = next(n for n in names if n not in done and all(d in done for d in deps[n]))
        done.append(ready)
    return done


def _covered(path: str, produced: Sequence[str]) -> bool:
    """Whether `path` (or glob) is one of `produced` or lies inside a produced folder."""
    return any(path == p or path.startswith(p.rstrip(os.sep) + os.sep) or fnmatch.fnmatch(p, path) for p in produced)


def _executable_problem(argv: Sequence[str]) -> tuple[str, str] | None:
    """(path, problem) when argv[0] (or the script a Python interpreter is given) is not there."""
    exe = argv[0]
    if os.sep in exe:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            return exe, "is not an executable file"
    elif shutil.which(exe) is None:
        return exe, "is not on PATH"
    script = argv[1] if len(argv) > 1 and Path(exe).name.startswith("python") and argv[1].endswith(".py") else None
    if script is not None and not os.path.isfile(script):
        return script, "(the Python script) does not exist"
    return None


def _parse_stage(raw: Any, index: int, label: str, values: Mapping[str, str], workdir: Path) -> Stage:
    where = f"{label}: stages[{index}]"
    if not isinstance(raw, dict):
        raise RecipeError(f"{where}: must be an object, got {type(raw).__name__}")
    if isinstance(raw.get("name"), str):
        where = f"{label}: stage '{raw['name']}'"
    _check_keys(raw, STAGE_KEYS, where, REQUIRED_STAGE_KEYS)
    name = raw["name"]
    if not STAGE_NAME.match(name):
        raise RecipeError(f"{where}.name: {name!r} is not a stage name (letters, digits, '_', '.', '-')")
    if raw["role"] not in ROLES:
        raise RecipeError(f"{where}.role: {raw['role']!r} is not one of {', '.join(ROLES)}")

    def sub(text: str, key: str) -> str:
        return substitute(text, values, lambda: f"{where}.{key}")

    argv = [sub(a, "argv") for a in _strings(raw["argv"], f"{where}.argv", non_empty=True)]
    env = []
    for key, value in raw.get("env", {}).items():
        if not isinstance(value, str):
            raise RecipeError(f"{where}.env.{key}: must be a string, got {type(value).__name__}")
        env.append((key, sub(value, f"env.{key}")))
    timeout = float(raw.get("timeout_s", DEFAULT_TIMEOUT_S))
    if timeout <= 0:
        raise RecipeError(f"{where}.timeout_s: must be > 0, got {timeout}")

    def paths(key: str) -> tuple[str, ...]:
        return tuple(_absolute(sub(p, key), workdir) for p in _strings(raw.get(key, []), f"{where}.{key}"))

    return Stage(
        name=name,
        role=raw["role"],
        argv=tuple(argv),
        env=tuple(env),
        timeout_s=timeout,
        depends_on=tuple(_strings(raw.get("depends_on", []), f"{where}.depends_on")),
        outputs=paths("outputs"),
        model_files=paths("model_files"),
        produces=paths("produces"),
        description=raw.get("description", ""),
    )


def parse_recipe(
    doc: Any, path: Path, workdir: Path, *, overrides: Mapping[str, str] | None = None, check_files: bool = True
) -> Recipe:
    """A `Recipe` from the parsed JSON `doc` of `path`; `overrides` replace entries of its `vars`.

    With `check_files`, every executable and model file must exist now or be declared in the `produces` of a
    stage the user depends on."""
    label = str(path)
    if not isinstance(doc, dict):
        raise RecipeError(f"{label}: a recipe is a JSON object, got {type(doc).__name__}")
    _check_keys(doc, RECIPE_KEYS, label, ("kind", "stages"))
    if doc["kind"] != KIND:
        raise RecipeError(f"{label}.kind: {doc['kind']!r} is not {KIND!r}")
    workdir = workdir.resolve()
    values = {
        "workdir": str(workdir),
        "python": sys.executable,
        "repo": str(repo_root(path.resolve())),
        "recipe_dir": str(path.resolve().parent),
    }
    raw_vars = dict(doc.get("vars", {}))
    for key in overrides or {}:
        if key not in raw_vars:
            raise RecipeError(
                f"{label}: --var {key}: the recipe has no var '{key}'", hint=f"vars: {', '.join(raw_vars)}"
            )
    raw_vars.update(overrides or {})
    for key, value in raw_vars.items():
        if key in values or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise RecipeError(f"{label}.vars.{key}: not a usable var name (built-ins: {', '.join(values)})")
        if not isinstance(value, str):
            raise RecipeError(f"{label}.vars.{key}: must be a string, got {type(value).__name__}")
    builtins = dict(values)
    for key, value in raw_vars.items():  # vars may use the built-ins, not each other
        values[key] = substitute(value, builtins, lambda key=key: f"{label}.vars.{key}")  # type: ignore[misc]

    stages = [_parse_stage(raw, i, label, values, workdir) for i, raw in enumerate(doc["stages"])]
    if not stages:
        raise RecipeError(f"{label}.stages: a recipe needs at least one stage")
    names = [s.name for s in stages]
    for name in names:
        if names.count(name) > 1:
            raise RecipeError(f"{label}: stage '{name}' is defined {names.count(name)} times")
    deps = {s.name: s.depends_on for s in stages}
    for s in stages:
        for dep in s.depends_on:
            if dep not in deps:
                raise RecipeError(
                    f"{label}: stage '{s.name}'.depends_on: unknown stage '{dep}'", hint=f"stages: {', '.join(names)}"
                )
    cycle = find_cycle(deps)
    if cycle is not None:
        raise RecipeError(f"{label}: dependency cycle {' -> '.join(cycle)}", hint="remove one of these depends_on")
    by_name = {s.name: s for s in stages}
    recipe = Recipe(
        path=path,
        name=doc.get("name", path.stem),
        description=doc.get("description", ""),
        workdir=workdir,
        stages=tuple(by_name[n] for n in dependency_order(names, deps)),
    )
    if check_files:
        for s in recipe.stages:
            _check_stage_files(recipe, s, label)
    return recipe


def _check_stage_files(recipe: Recipe, stage: Stage, label: str) -> None:
    produced = [p for dep in recipe.ancestors(stage.name) for p in recipe.stage(dep).produces]
    problem = _executable_problem(stage.argv)
    if problem is not None and not _covered(problem[0], produced):
        raise RecipeError(
            f"{label}: stage '{stage.name}'.argv: {problem[0]} {problem[1]}",
            hint="install it, fix the path, or have a setup stage it depends on declare it in 'produces'",
        )
    for pattern in stage.model_files:
        if not glob.glob(pattern, recursive=True) and not _covered(pattern, produced):
            raise RecipeError(
                f"{label}: stage '{stage.name}'.model_files: nothing matches {pattern}",
                hint="fix the path, or have a setup stage it depends on declare it in 'produces'",
            )


def load_recipe(
    path: str | Path, workdir: str | Path, *, overrides: Mapping[str, str] | None = None, check_files: bool = True
) -> Recipe:
    """Read and check the recipe at `path` for a run in `workdir` (see `parse_recipe`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read the recipe: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RecipeError(f"{path}: not JSON: {exc}") from None
    except RecursionError:
        raise RecipeError(f"{path}: not JSON: nested too deeply") from None
    return parse_recipe(doc, path, Path(workdir), overrides=overrides, check_files=check_files)
