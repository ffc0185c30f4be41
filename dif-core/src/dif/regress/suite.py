"""Regression suites for `dif regress` (outside the pipeline: they run dif's commands as fresh processes).

A suite (JSON, schema "dif-regress-suite/1") lists checks:
    {"name": "...", "tiers": ["smoke", "model:klein-4b", ...], "kind": "correctness" | "performance",
     "argv": ["dif", ...],                  # "dif" runs this interpreter's `python -m dif_tools`
     "timeout_s": 600, "expect_exit": 0,
     "assert": [{"path": "data.x.0.y", "op": "==", "value": ...}],   # on the JSON document it printed
     "requires": {"backends": ["cuda"], "modules": ["torch"], "files": ["{repo}/..."]},
     "metric": "data.summary.measured.median_s", "better": "lower", "repeat": 3}   # performance only
`{repo}` (the repository holding the suite), `{workdir}` and `{python}` are substituted in argv and files.
A check whose requirements this host lacks is BLOCKED (never PASS). A performance check compares the
median of `repeat` runs with the baseline's (`dif regress record`): it regresses when worse by more than
max(5 %, 3 x the baseline's half-range); without a baseline it is NO BASELINE.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from dif.errors import FormatError, UsageError

SUITE_SCHEMA = "dif-regress-suite/1"
BASELINE_SCHEMA = "dif-regress-baseline/1"
PASS, FAIL, BLOCKED, NO_BASELINE = "PASS", "FAIL", "BLOCKED", "NO BASELINE"
KINDS = ("correctness", "performance")
OPS = ("exists", "==", "!=", "<", "<=", ">", ">=", "in", "len>=")
REL_FLOOR = 0.05
SPREAD_FACTOR = 3.0
_KEYS = {
    "name",
    "tiers",
    "kind",
    "argv",
    "timeout_s",
    "expect_exit",
    "assert",
    "requires",
    "metric",
    "better",
    "repeat",
}


@frozen
class Check:
    name: str
    tiers: tuple[str, ...]
    kind: str
    argv: tuple[str, ...]
    timeout_s: float = 600.0
    expect_exit: int = 0
    asserts: tuple[dict[str, Any], ...] = ()
    requires: dict[str, tuple[str, ...]] = field(factory=dict)
    metric: str | None = None
    better: str = "lower"
    repeat: int = 1


def _fail(path: Path, msg: str) -> FormatError:
    return FormatError(f"{path}: {msg}")


def _strs(value: Any, path: Path, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, f"{where} must be a list of strings")
    return tuple(value)


def _check(raw: Any, i: int, path: Path) -> Check:
    where = f"checks[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, f"{where} must be an object")
    if set(raw) - _KEYS:
        raise _fail(path, f"{where}: unknown keys {sorted(set(raw) - _KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(path, f"{where} needs a name")
    where = f"check '{name}'"
    kind = raw.get("kind", "correctness")
    if kind not in KINDS:
        raise _fail(path, f"{where}: kind {kind!r} is not one of {KINDS}")
    argv = _strs(raw.get("argv"), path, f"{where}.argv")
    if not argv:
        raise _fail(path, f"{where}: argv is empty")
    asserts = raw.get("assert", [])
    if not isinstance(asserts, list):
        raise _fail(path, f"{where}: assert must be a list")
    for a in asserts:
        if not isinstance(a, dict) or not isinstance(a.get("path"), str) or a.get("op", "exists") not in OPS:
            raise _fail(path, f"{where}: each assertion needs a path and an op of {OPS}")
        if a.get("op", "exists") != "exists" and "value" not in a:
            raise _fail(path, f"{where}: assertion on {a['path']} with op {a['op']} needs a value")
    req = raw.get("requires", {})
    if not isinstance(req, dict) or set(req) - {"backends", "modules", "files"}:
        raise _fail(path, f"{where}: requires takes backends, modules, files")
    requires = {k: _strs(v, path, f"{where}.requires.{k}") for k, v in req.items()}
    metric = raw.get("metric")
    if kind == "performance" and not isinstance(metric, str):
        raise _fail(path, f"{where}: a performance check needs a metric (a JSON path in its document)")
    repeat = raw.get("repeat", 1)
    if not isinstance(repeat, int) or isinstance(repeat, bool) or not 1 <= repeat <= 100:
        raise _fail(path, f"{where}: repeat must be an integer 1..100")
    better = raw.get("better", "lower")
    if better not in ("lower", "higher"):
        raise _fail(path, f"{where}: better must be lower or higher")
    timeout = raw.get("timeout_s", 600)
    expect = raw.get("expect_exit", 0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise _fail(path, f"{where}: timeout_s must be a positive number")
    if not isinstance(expect, int) or isinstance(expect, bool):
        raise _fail(path, f"{where}: expect_exit must be an integer")
    tiers = _strs(raw.get("tiers", []), path, f"{where}.tiers")
    return Check(name, tiers, kind, argv, float(timeout), expect, tuple(asserts), requires, metric, better, repeat)


def load_suite(path: str | Path) -> tuple[Check, ...]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FormatError(f"{path}: cannot read the suite ({exc.strerror})") from None
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"{path}: the suite is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schema") != SUITE_SCHEMA or not isinstance(doc.get("checks"), list):
        raise _fail(path, f"not a {SUITE_SCHEMA} suite (schema + checks)")
    checks = tuple(_check(raw, i, path) for i, raw in enumerate(doc["checks"]))
    names = [c.name for c in checks]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(path, f"check names appear twice: {dup}")
    return checks


def select(checks: tuple[Check, ...], tier: str, model: str | None = None) -> tuple[Check, ...]:
    """The checks of a tier: "smoke", "model" (with `model`: tier "model:NAME"), or "full" (all)."""
    if tier == "full":
        return checks
    if tier == "model":
        if not model:
            raise UsageError("--tier model needs a model name", hint="--tier model klein-4b")
        chosen = tuple(c for c in checks if f"model:{model}" in c.tiers)
        if not chosen:
            known = sorted({t.split(":", 1)[1] for c in checks for t in c.tiers if t.startswith("model:")})
            raise UsageError(f"the suite has no model tier '{model}' (models: {', '.join(known) or 'none'})")
        return chosen
    if tier == "smoke":
        return tuple(c for c in checks if "smoke" in c.tiers)
    raise UsageError(f"unknown tier {tier!r}", hint="smoke, model NAME or full")


def lookup(doc: Any, path: str) -> tuple[bool, Any]:
    """(found, value) at a dotted path ("data.rows.0.name") in a JSON value."""
    cur = doc
    for part in path.split(".") if path else []:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return False, None
    return True, cur


def _holds(found: bool, value: Any, op: str, want: Any) -> bool:
    if op == "exists":
        return found
    if not found:
        return False
    try:
        return {
            "==": lambda: value == want,
            "!=": lambda: value != want,
            "<": lambda: value < want,
            "<=": lambda: value <= want,
            ">": lambda: value > want,
            ">=": lambda: value >= want,
            "in": lambda: value in want,
            "len>=": lambda: len(value) >= want,
        }[op]()
    except TypeError:
        return False


def blocked_by(check: Check, values: Mapping[str, str]) -> list[str]:
    """What this host lacks for `check` (empty: it can run)."""
    missing = []
    for mod in check.requires.get("modules", ()):
        if importlib.util.find_spec(mod) is None:
            missing.append(f"python module '{mod}' is not installed")
    for f in check.requires.get("files", ()):
        if not Path(substitute(f, values)).exists():
            missing.append(f"file {substitute(f, values)} does not exist")
    wanted = check.requires.get("backends", ())
    if wanted:
        from dif.runtime import backend_status

        ok = {info.name for info, avail in backend_status() if avail.ok}
        missing += [f"backend '{b}' is not available here" for b in wanted if b not in ok]
    return missing


def substitute(text: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def _argv(check: Check, values: Mapping[str, str]) -> list[str]:
    argv = [substitute(a, values) for a in check.argv]
    return [sys.executable, "-m", "dif_tools", *argv[1:]] if argv[0] == "dif" else argv


def _once(check: Check, values: Mapping[str, str]) -> dict[str, Any]:
    argv = _argv(check, values)
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=check.timeout_s, env=dict(os.environ))
    except FileNotFoundError:
        return {"blocked": f"{argv[0]} is not on this host"}
    except subprocess.TimeoutExpired:
        return {"exit": None, "wall_s": check.timeout_s, "error": f"timed out after {check.timeout_s:g} s"}
    out: dict[str, Any] = {"exit": proc.returncode, "wall_s": round(time.perf_counter() - start, 4)}
    out["stderr_tail"] = proc.stderr[-600:]
    try:
        out["doc"] = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        out["doc"] = None
    return out


def run_check(check: Check, values: Mapping[str, str], baseline: Mapping[str, Any] | None) -> dict[str, Any]:
    """Run one check; returns {name, kind, status, reasons, ...}."""
    row: dict[str, Any] = {"name": check.name, "kind": check.kind, "tiers": list(check.tiers)}
    missing = blocked_by(check, values)
    if missing:
        return {**row, "status": BLOCKED, "reasons": missing}
    samples: list[float] = []
    reasons: list[str] = []
    for _ in range(check.repeat if check.kind == "performance" else 1):
        got = _once(check, values)
        if "blocked" in got:
            return {**row, "status": BLOCKED, "reasons": [got["blocked"]]}
        if got.get("error"):
            reasons.append(got["error"])
            break
        if got["exit"] != check.expect_exit:
            reasons.append(
                f"exit status {got['exit']}, expected {check.expect_exit}: {got['stderr_tail'].strip()[-300:]}"
            )
            break
        for a in check.asserts:
            found, value = lookup(got["doc"], a["path"])
            op = a.get("op", "exists")
            if not _holds(found, value, op, a.get("value")):
                shown = repr(value)[:80] if found else "absent"
                reasons.append(f"{a['path']} {op} {a.get('value', '')!r}: got {shown}".replace(" ''", ""))
        if reasons:
            break
        if check.metric is not None:
            found, value = lookup(got["doc"], check.metric)
            if not found or not isinstance(value, int | float) or isinstance(value, bool):
                reasons.append(f"metric {check.metric} is not a number in the document")
                break
            samples.append(float(value))
    if reasons:
        return {**row, "status": FAIL, "reasons": reasons}
    if check.kind == "correctness":
        return {**row, "status": PASS, "reasons": []}
    median = statistics.median(samples)
    row.update(samples=samples, median=median, metric=check.metric, better=check.better)
    base = (baseline or {}).get(check.name)
    if base is None:
        return {**row, "status": NO_BASELINE, "reasons": ["no baseline recorded for this check (dif regress record)"]}
    tol = max(REL_FLOOR * abs(base["median"]), SPREAD_FACTOR * base.get("half_range", 0.0))
    worse = median - base["median"] if check.better == "lower" else base["median"] - median
    row.update(baseline_median=base["median"], tolerance=tol)
    if worse > tol:
        return {
            **row,
            "status": FAIL,
            "reasons": [
                f"median {median:.6g} is worse than baseline {base['median']:.6g} by {worse:.3g} > tolerance {tol:.3g}"
            ],
        }
    return {**row, "status": PASS, "reasons": []}


def read_baseline(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FormatError(f"{path}: cannot read the baseline ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("schema") != BASELINE_SCHEMA or not isinstance(doc.get("checks"), dict):
        raise FormatError(f"{path}: not a {BASELINE_SCHEMA} baseline")
    for name, b in doc["checks"].items():
        if not isinstance(b, dict) or not isinstance(b.get("median"), int | float):
            raise FormatError(f"{path}: baseline of '{name}' has no numeric median")
    return doc["checks"]  # type: ignore[no-any-return]


def baseline_doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A baseline from the performance rows that ran (median and half of the sample range)."""
    checks = {
        r["name"]: {
            "median": r["median"],
            "half_range": (max(r["samples"]) - min(r["samples"])) / 2.0,
            "samples": r["samples"],
            "metric": r["metric"],
        }
        for r in rows
        if r["kind"] == "performance" and "median" in r
    }
    return {"schema": BASELINE_SCHEMA, "checks": checks}
