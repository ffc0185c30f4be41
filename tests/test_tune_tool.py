"""`dif tune` on the tiny FLUX.2 [klein] transformer: every distinct GEMM / attention problem is listed with
the CPU backend's one candidate (its reference lowering) and a measured verdict, a second run reuses the
stored verdicts, a backend that offers candidates has a wrong one rejected by the numerical gate, and the
cuda backend's stored library choices are listed read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def data_of(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    result = CliRunner().invoke(build_cli(), [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    return doc["data"]  # type: ignore[no-any-return]


def test_tune_cpu_problems_and_reuse(tiny_klein: dict[str, Any], tmp_path: Path) -> None:
    from dif.tune import problems

    env = {"DIF_CACHE_DIR": str(tmp_path / "cache")}
    report = tmp_path / "tune.json"
    args = ["tune", str(tiny_klein["difir"]), "--backend", "cpu", "--repeat", "2", "--report", str(report)]
    data = data_of(args, env)
    want = problems(tiny_klein["program"])
    assert [r["problem"] for r in data["problems"]] == list(want)
    assert {r["kind"] for r in data["problems"]} == {"gemm", "attention"}
    for row in data["problems"]:
        (cand,) = row["candidates"]
        assert cand["verdict"] == "chosen" and cand["ms_median"] >= 0 and row["source"] == "measured"
        assert "nothing to choose" in row["note"]
    validate_document(json.loads(report.read_text()))
    again = data_of(args, env)
    assert all(r["source"] == "cached" for r in again["problems"])
    assert all(r["source"] == "measured" for r in data_of([*args, "--force"], env)["problems"])
    assert data["stored_library_choices"]["entries"] == []


def test_candidates_are_gated(tiny_klein: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dif.ops.registry import OPS
    from dif.runtime import get_backend
    from dif.tune import tune_program

    monkeypatch.setenv("DIF_CACHE_DIR", str(tmp_path / "cache"))
    backend = get_backend("cpu")

    def offer(node: Any, program: Any) -> list[tuple[str, Any]]:
        ref = OPS.get(node.op).run_reference
        return [
            ("reference", ref),
            ("off by 1 %", lambda ops, attrs: tuple(np.asarray(r) * 1.01 for r in ref(ops, attrs))),
            ("broken", lambda ops, attrs: (_ for _ in ()).throw(RuntimeError("no kernel"))),
        ]

    backend.tune_candidates = offer  # type: ignore[attr-defined]
    rows = tune_program(tiny_klein["program"], backend, repeat=1)
    for row in rows:
        verdicts = {c["candidate"]: c["verdict"] for c in row["candidates"]}
        assert verdicts == {
            "reference": "chosen",
            "off by 1 %": "rejected: numerical gate",
            "broken": "rejected: does not run",
        }
        assert row["chosen"] == "reference"


def test_stored_library_choices_are_listed(tmp_path: Path) -> None:
    from dif.diskcache import key_digest, write_entry
    from dif.tune import stored_choices

    folder = tmp_path / "cuda" / "choices"
    key = {"library": "cublasLt", "version": "cublasLt 12", "device": "H200", "problem": "(1, 2, 3)", "candidates": "4"}
    write_entry(folder / f"cublasLt-{key_digest(key)}.json", json.dumps({"choice": 2}).encode(), key)
    (row,) = stored_choices(folder)
    assert row["library"] == "cublasLt" and row["choice"] == 2 and row["problem"] == "(1, 2, 3)"
    data = data_of(["tune"], {"DIF_CACHE_DIR": str(tmp_path)})
    assert data["stored_library_choices"]["entries"][0]["choice"] == 2
