"""`dif trace program|recipe|merge`: where the time of an execution went, attributed to DiffIR ops, op
kinds, provenance blocks and stages, from the runtime's trace documents (`dif.trace`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


def _print_attribution(a: dict[str, Any]) -> None:
    click.echo(
        f"{a['executions']} executions, wall {a['wall_ms']:.3f} ms: attributed {a['attributed_ms']:.3f} ms, "
        f"unattributed {a['unattributed_ms']:.3f} ms"
    )
    for key, title in (("by_stage", "stage"), ("by_kind", "kind"), ("by_block", "block"), ("top_ops", "op")):
        rows = [[r["name"], f"{r['ms']:.3f}", r["count"], f"{r['share']:.1%}"] for r in a[key]]
        if rows:
            click.echo()
            click.echo(table([title, "ms", "count", "share"], rows))


def _write_traces(path: Path, docs: list[dict[str, Any]]) -> None:
    from dif.serialize.container import write_atomic

    write_atomic(path, "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs).encode())


@click.group("trace")
def trace() -> None:
    """Attribute execution time to ops, op kinds, blocks and stages (DIF_TRACE_FILE documents)."""


@trace.command("program")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--inputs", "inputs_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--weights", "weights_path", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", "backend_name", default=None, help="Backend name (default: DIF_BACKEND or the best).")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1, 1000), help="Traced runs after a warm-up.")
@click.option(
    "--save-trace", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Write the documents."
)
@click.option(
    "--save-program",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the executed (optimized) program with its provenance, the one the trace's op ids refer to.",
)
@click.option("--top", default=20, show_default=True, type=click.IntRange(1, 10000))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def trace_program(
    file: Path,
    inputs_path: Path,
    weights_path: Path | None,
    backend_name: str | None,
    runs: int,
    save_trace: Path | None,
    save_program: Path | None,
    top: int,
    as_json: bool,
) -> None:
    """Prepare FILE.difir, run it once untraced (warm-up), then RUNS times traced, and attribute the runs."""
    from dif import trace as rt
    from dif.interp import bind_check
    from dif.runtime import get_backend, prepare
    from dif.serialize.difir import load_program
    from dif.serialize.difir import save_program as write_program
    from dif.serialize.diftensor import load_tensors
    from dif.serialize.provenance import save_provenance
    from dif.telemetry import hardware_entry
    from dif.trace.attribute import attribute

    program = load_program(file)
    inputs, _ = load_tensors(inputs_path)
    weights = load_tensors(weights_path)[0] if weights_path is not None else {}
    bind_check(program, inputs, weights)
    backend = get_backend(backend_name, program=program)
    profile, budget = backend.profile(), backend.budget()
    with rt.collecting() as prepared:
        executable, plan = prepare(program, weights, backend, budget)
    executable.run(inputs)  # warm-up: caches and first-touch pages are not what a steady run waits for
    with rt.collecting() as docs:
        for _ in range(runs):
            executable.run(inputs)
    if not docs:
        raise click.ClickException(f"backend '{backend.name}' recorded no trace (its executor has no trace points)")
    if save_trace is not None:
        _write_traces(save_trace, [*prepared, *docs])
    if save_program is not None:
        executed = getattr(executable, "program", None)
        if executed is None:
            raise click.ClickException(f"backend '{backend.name}' does not expose the program it executes")
        write_program(executed, save_program)
        save_provenance(executed, save_program.with_name(save_program.name + ".prov.json"))
    data: dict[str, Any] = {
        "program": program.name,
        "backend": backend.name,
        "runs": runs,
        "plan": {"arena_bytes": plan.arena_bytes, "streamed": len(plan.streamed)},
        "attribution": attribute(docs, top=top),
        "prepare": attribute(prepared, top=top) if prepared else None,
    }
    if as_json:
        emit_document(
            "trace.program",
            data,
            hardware=[hardware_entry(backend.name, profile=profile)],
            runtime_budget={backend.name: budget},
        )
        return
    click.echo(f"{program.name} on {backend.name}, {runs} traced runs")
    _print_attribution(data["attribution"])


@trace.command("merge")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--top", default=20, show_default=True, type=click.IntRange(1, 10000))
@click.option("--stage", "stages", multiple=True, help="Only executions of this stage (prepare, run).")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def trace_merge(files: tuple[Path, ...], top: int, stages: tuple[str, ...], as_json: bool) -> None:
    """Attribute the trace documents of one or more DIF_TRACE_FILE files together."""
    from dif.trace.attribute import attribute, read_traces

    docs = read_traces(files)
    if stages:
        docs = [d for d in docs if d["data"]["stage"] in stages]
    data: dict[str, Any] = {"files": [str(f) for f in files], "attribution": attribute(docs, top=top)}
    if as_json:
        emit_document("trace.merge", data)
        return
    _print_attribution(data["attribution"])


@trace.command("recipe")
@click.argument("recipe_path", metavar="RECIPE.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workdir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--var", "var_items", multiple=True, metavar="KEY=VALUE", help="Override one of the recipe's vars.")
@click.option("--top", default=20, show_default=True, type=click.IntRange(1, 10000))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def trace_recipe(recipe_path: Path, workdir: Path, var_items: tuple[str, ...], top: int, as_json: bool) -> None:
    """Run RECIPE.json's measured chain once (as `dif bench` does) with DIF_TRACE_FILE set for every stage,
    then attribute each stage's wall to its traced executions; the rest is reported as outside any execution."""
    from dif.bench import load_recipe, run_recipe
    from dif.env import DIF_TRACE_FILE
    from dif.trace.attribute import attribute, read_trace_file
    from dif_tools.commands.bench import _vars

    recipe = load_recipe(recipe_path, workdir, overrides=_vars(var_items))
    recipe.workdir.mkdir(parents=True, exist_ok=True)
    trace_file = recipe.workdir / "trace.jsonl"
    trace_file.unlink(missing_ok=True)
    saved = os.environ.get(DIF_TRACE_FILE.name)
    os.environ[DIF_TRACE_FILE.name] = str(trace_file.resolve())
    try:
        result = run_recipe(recipe, repeat=1, roles=("setup", "measured"))
    finally:
        if saved is None:
            os.environ.pop(DIF_TRACE_FILE.name, None)
        else:
            os.environ[DIF_TRACE_FILE.name] = saved
    docs = read_trace_file(trace_file) if trace_file.is_file() else []
    stages = [
        {"name": r["name"], "role": r["role"], "status": r["status"], "wall_s": r.get("wall_s")}
        for records in result.rounds
        for r in records
    ]
    measured_s = sum(s["wall_s"] or 0.0 for s in stages if s["role"] == "measured")
    attribution = attribute(docs, top=top)
    data = {
        "recipe": str(recipe_path),
        "trace_file": str(trace_file),
        "stages": stages,
        "measured_wall_ms": round(measured_s * 1000.0, 3),
        "outside_executions_ms": round(measured_s * 1000.0 - attribution["wall_ms"], 3),
        "attribution": attribution,
    }
    if as_json:
        emit_document("trace.recipe", data)
    else:
        click.echo(
            f"measured chain {data['measured_wall_ms']:.1f} ms; inside traced executions "
            f"{attribution['wall_ms']:.1f} ms; outside them {data['outside_executions_ms']:.1f} ms"
        )
        _print_attribution(attribution)
    if not result.ok:
        raise SystemExit(1)
