"""`dif run`: load a .difir program and tensors, plan and prepare on a backend, run once, save outputs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dif_tools.output import emit_document

if TYPE_CHECKING:
    import numpy as np


@click.command("run")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--inputs",
    "inputs_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="safetensors file with one tensor per program input.",
)
@click.option(
    "--weights",
    "weights_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="safetensors file with one tensor per program parameter.",
)
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="safetensors file to write the outputs to.",
)
@click.option(
    "--backend", "backend_name", default=None, help="Backend name (default: DIF_BACKEND or the best available)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def run(
    file: Path, inputs_path: Path, weights_path: Path | None, out_path: Path, backend_name: str | None, as_json: bool
) -> None:
    """Run FILE.difir once on INPUTS (and WEIGHTS) and write the outputs to OUT."""
    from dif.fingerprint import fingerprint
    from dif.interp import bind_check
    from dif.runtime import get_backend, prepare
    from dif.serialize.difir import load_program
    from dif.serialize.diftensor import load_tensors, save_tensors
    from dif.telemetry import EventLog, hardware_entry

    log = EventLog()
    with log.span("load_program"):
        program = load_program(file)
    with log.span("load_inputs") as ev:
        inputs, _ = load_tensors(inputs_path)
        ev["bytes"] = sum(int(a.nbytes) for a in inputs.values())
    weights: dict[str, np.ndarray] = {}
    if weights_path is not None:
        with log.span("load_weights") as ev:
            weights, _ = load_tensors(weights_path)
            ev["bytes"] = sum(int(a.nbytes) for a in weights.values())
    bind_check(program, inputs, weights)
    backend = get_backend(backend_name, program=program)  # one that has every op and dtype of it
    profile, budget = backend.profile(), backend.budget()
    with log.span("prepare", backend=backend.name):
        executable, plan = prepare(program, weights, backend, budget)
    with log.span("run", backend=backend.name):
        outputs = executable.run(inputs)
    fp = fingerprint(program)
    with log.span("save_outputs") as ev:
        save_tensors(out_path, outputs, {"program": program.name, "fingerprint": fp, "backend": backend.name})
        ev["bytes"] = sum(int(a.nbytes) for a in outputs.values())
    data: dict[str, Any] = {
        "program": program.name,
        "fingerprint": fp,
        "backend": backend.name,
        "out": str(out_path),
        "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in outputs.items()},
        "plan": {
            "arena_bytes": plan.arena_bytes,
            "peak_bytes": plan.peak_bytes,
            "param_bytes": plan.param_bytes,
            "streamed": len(plan.streamed),
            "precision": plan.precision,
        },
    }
    if as_json:
        emit_document(
            "run",
            data,
            hardware=[hardware_entry(backend.name, profile=profile)],
            runtime_budget={backend.name: budget},
            events=log,
        )
        return
    for name, info in data["outputs"].items():
        click.echo(f"{name}: {info['dtype']}{info['shape']}")
    click.echo(f"wrote {out_path} ({backend.name}, {sum(e.get('ms', 0) for e in log.events):.1f} ms)")
