"""`dif regress`: strict correctness (exit status, JSON assertions), BLOCKED where the host lacks what a
check needs, performance against a recorded baseline with a noise-aware tolerance, and the repository's
perf/regress/suite.json is valid and tiered."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif_tools.cli import build_cli

REPO = Path(__file__).resolve().parents[2]


def invoke(args: list[str]) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(build_cli(), [*args, "--json"])
    assert "Traceback" not in result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    return result.exit_code, doc["data"]


def emit(value: float) -> list[str]:
    return ["{python}", "-c", f"import json; print(json.dumps({{'data': {{'v': {value}, 'ok': True}}}}))"]


def suite(tmp_path: Path, checks: list[dict[str, Any]]) -> Path:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"schema": "dif-regress-suite/1", "checks": checks}))
    return path


def test_correctness_and_blocked(tmp_path: Path) -> None:
    checks = [
        {
            "name": "ok",
            "tiers": ["smoke"],
            "argv": emit(1.0),
            "assert": [{"path": "data.ok", "op": "==", "value": True}],
        },
        {"name": "wrong", "tiers": ["smoke"], "argv": emit(1.0), "assert": [{"path": "data.v", "op": ">", "value": 2}]},
        {"name": "exit", "tiers": ["smoke"], "argv": ["{python}", "-c", "raise SystemExit(3)"]},
        {"name": "nomod", "tiers": ["smoke"], "argv": emit(1.0), "requires": {"modules": ["no_such_module_xyz"]}},
        {"name": "nobackend", "tiers": ["full"], "argv": emit(1.0), "requires": {"backends": ["no-such-backend"]}},
        {"name": "noexe", "tiers": ["smoke"], "argv": ["/no/such/program"]},
    ]
    path = suite(tmp_path, checks)
    code, data = invoke(["regress", "run", str(path), "--tier", "smoke", "--workdir", str(tmp_path / "w")])
    status = {r["name"]: r["status"] for r in data["checks"]}
    assert code == 1 and data["verdict"] == "FAIL"
    assert status == {"ok": "PASS", "wrong": "FAIL", "exit": "FAIL", "nomod": "BLOCKED", "noexe": "BLOCKED"}
    reasons = {r["name"]: r["reasons"] for r in data["checks"]}
    assert "data.v > 2: got 1.0" in reasons["wrong"][0] and "exit status 3" in reasons["exit"][0]
    code, data = invoke(["regress", "run", str(path), "--tier", "full"])
    assert {r["name"]: r["status"] for r in data["checks"]}["nobackend"] == "BLOCKED"


def test_performance_against_baseline(tmp_path: Path) -> None:
    perf = {
        "name": "speed",
        "tiers": ["smoke"],
        "kind": "performance",
        "argv": emit(2.0),
        "metric": "data.v",
        "repeat": 3,
    }
    path = suite(tmp_path, [perf])
    code, data = invoke(["regress", "run", str(path), "--tier", "smoke"])
    assert code == 0 and data["checks"][0]["status"] == "NO BASELINE" and data["verdict"] == "INCOMPLETE"
    base = tmp_path / "base.json"
    code, data = invoke(["regress", "record", str(path), "--tier", "smoke", "--out", str(base)])
    assert code == 0 and json.loads(base.read_text())["checks"]["speed"]["median"] == 2.0
    code, data = invoke(["regress", "run", str(path), "--tier", "smoke", "--baseline", str(base)])
    assert code == 0 and data["verdict"] == "PASS"
    # a baseline that says 1.0 with no spread: 2.0 is worse by far more than the 5 % floor
    base.write_text(
        json.dumps({"schema": "dif-regress-baseline/1", "checks": {"speed": {"median": 1.0, "half_range": 0.0}}})
    )
    code, data = invoke(["regress", "run", str(path), "--tier", "smoke", "--baseline", str(base)])
    assert code == 1 and "worse than baseline" in data["checks"][0]["reasons"][0]
    # within 3 x the recorded half-range it passes
    base.write_text(
        json.dumps({"schema": "dif-regress-baseline/1", "checks": {"speed": {"median": 1.5, "half_range": 0.2}}})
    )
    code, data = invoke(["regress", "run", str(path), "--tier", "smoke", "--baseline", str(base)])
    assert code == 0 and data["checks"][0]["tolerance"] == pytest.approx(0.6)


def test_bad_suites_are_refused(tmp_path: Path) -> None:
    bad = suite(tmp_path, [{"name": "p", "kind": "performance", "argv": ["x"]}])
    result = CliRunner().invoke(build_cli(), ["regress", "run", str(bad), "--tier", "full"])
    assert result.exit_code == 1 and "needs a metric" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(build_cli(), ["regress", "run", str(bad), "--tier", "model", "nope"])
    assert result.exit_code == 1


def test_repository_suite(tmp_path: Path) -> None:
    from dif.regress.suite import load_suite, run_check, select

    checks = load_suite(REPO / "perf" / "regress" / "suite.json")
    smoke = {c.name for c in select(checks, "smoke")}
    assert {"probe", "run-example-mlp", "tiny-generate-cpu"} <= smoke and "klein-9b-h200" not in smoke
    (klein,) = select(checks, "model", "klein-9b")
    from dif.runtime import backend_status

    if any(info.name == "cuda" and avail.ok for info, avail in backend_status()):
        pytest.skip("cuda is available: the klein-9b check would run the full benchmark")
    values = {"repo": str(REPO), "workdir": "/nonexistent", "python": sys.executable}
    assert run_check(klein, values, None)["status"] == "BLOCKED"
    for name in ("probe", "run-example-mlp", "bad-plan-refused"):
        (check,) = [c for c in checks if c.name == name]
        assert run_check(check, {**values, "workdir": str(tmp_path)}, None)["status"] == "PASS", name
