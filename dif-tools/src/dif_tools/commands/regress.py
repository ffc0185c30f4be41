"""`dif regress run|record SUITE.json --tier smoke|model NAME|full`: run a suite of dif commands as fresh
processes, strict on correctness, noise-aware on performance, BLOCKED where the host cannot run a check."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


def _run(suite: Path, tier: str, model: tuple[str, ...], workdir: Path | None, baseline: Path | None) -> dict[str, Any]:
    from dif.bench.recipe import repo_root
    from dif.errors import UsageError
    from dif.regress.suite import load_suite, read_baseline, run_check, select

    if len(model) > 1 or (model and tier != "model"):
        raise UsageError(f"unexpected arguments {' '.join(model)}", hint="only --tier model takes a NAME")
    checks = select(load_suite(suite), tier, model[0] if model else None)
    base = read_baseline(baseline) if baseline is not None else None
    folder = workdir or Path(tempfile.mkdtemp(prefix="dif-regress-"))
    folder.mkdir(parents=True, exist_ok=True)
    values = {
        "repo": str(repo_root(suite.resolve())),
        "workdir": str(folder.resolve()),
        "python": __import__("sys").executable,
    }
    rows = []
    for check in checks:
        click.echo(f"[{check.name}] running", err=True)
        row = run_check(check, values, base)
        click.echo(f"[{check.name}] {row['status']}", err=True)
        rows.append(row)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("PASS", "FAIL", "BLOCKED", "NO BASELINE")}
    verdict = "FAIL" if counts["FAIL"] else ("PASS" if counts["PASS"] == len(rows) and rows else "INCOMPLETE")
    return {
        "suite": str(suite),
        "tier": tier if not model else f"model:{model[0]}",
        "baseline": str(baseline) if baseline else None,
        "workdir": str(folder),
        "verdict": verdict,
        "counts": counts,
        "checks": rows,
    }


def _show(data: dict[str, Any]) -> None:
    rows = [[r["name"], r["kind"], r["status"], "; ".join(r["reasons"])[:100]] for r in data["checks"]]
    if rows:
        click.echo(table(["check", "kind", "status", "why"], rows))
    click.echo(f"{data['verdict']}: " + ", ".join(f"{n} {k}" for k, n in data["counts"].items() if n))


@click.group("regress")
def regress() -> None:
    """Correctness and performance regression suites (perf/regress/suite.json)."""


@regress.command("run")
@click.argument("suite", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model", nargs=-1)
@click.option("--tier", required=True, help="smoke, model NAME, or full.")
@click.option("--baseline", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workdir", default=None, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def regress_run(
    suite: Path, model: tuple[str, ...], tier: str, baseline: Path | None, workdir: Path | None, as_json: bool
) -> None:
    """Run the tier's checks; exit 1 when any FAILs. BLOCKED and NO BASELINE checks are not passes: the
    verdict is then INCOMPLETE (exit 0)."""
    data = _run(suite, tier, model, workdir, baseline)
    if as_json:
        emit_document("regress", data)
    else:
        _show(data)
    if data["verdict"] == "FAIL":
        raise SystemExit(1)


@regress.command("record")
@click.argument("suite", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("model", nargs=-1)
@click.option("--tier", required=True, help="smoke, model NAME, or full.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workdir", default=None, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def regress_record(
    suite: Path, model: tuple[str, ...], tier: str, out_path: Path, workdir: Path | None, as_json: bool
) -> None:
    """Run the tier and write the performance checks' medians and spreads as a baseline to OUT; refused
    (nothing written) when a correctness check fails."""
    import json

    from dif.errors import DifError
    from dif.regress.suite import baseline_doc
    from dif.serialize.container import write_atomic

    data = _run(suite, tier, model, workdir, None)
    if data["verdict"] == "FAIL":
        failed = [r["name"] for r in data["checks"] if r["status"] == "FAIL"]
        raise DifError(f"not recording a baseline: checks failed ({', '.join(failed)})")
    doc = baseline_doc(data["checks"])
    write_atomic(out_path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    data["recorded"] = sorted(doc["checks"])
    if as_json:
        emit_document("regress.record", data)
    else:
        _show(data)
        click.echo(f"wrote {out_path} ({len(doc['checks'])} performance baselines)")
