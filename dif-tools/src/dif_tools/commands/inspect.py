"""`dif inspect FILE.difir`: what a program is (ops, types, parameters, fingerprint, provenance)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, human_bytes


def sidecar_candidates(path: Path) -> list[Path]:
    """Where a provenance sidecar for `path` may lie, in the order they are tried."""
    from dif.serialize.provenance import SUFFIX

    return [path.with_name(path.name + ".prov.json"), path.with_name(path.name + SUFFIX), path.with_suffix(SUFFIX)]


def provenance_summary(path: Path, program: Any) -> dict[str, Any] | None:
    """Where the program's provenance comes from (a sidecar file or the embedded section) and what it names."""
    from dif.ir.program import Provenance
    from dif.serialize.provenance import load_provenance

    sidecar = next((p for p in sidecar_candidates(path) if p.is_file()), None)
    if sidecar is not None:
        records = load_provenance(sidecar, program=program)  # checks it belongs to this program
        source, where = "sidecar", sidecar
    else:
        records = {k: v for k, v in program.provenance.items() if v != Provenance()}
        source, where = "embedded", path
    if not records:
        return None
    return {
        "source": source,
        "path": str(where),
        "nodes": len(records),
        "nodes_in_program": len(program.nodes),
        "modules": sorted({p.module for p in records.values() if p.module}),
        "frontend_revisions": sorted({p.frontend_revision for p in records.values() if p.frontend_revision}),
        "checkpoint_tensors": len({t for p in records.values() for t in p.tensors}),
        "transforms": sorted({t for p in records.values() for t in p.transforms}),
    }


def describe(path: Path) -> tuple[Any, dict[str, Any]]:
    """(program, JSON-ready summary) of the .difir file at `path`."""
    from dif.fingerprint import fingerprint
    from dif.serialize.difir import load_program

    program = load_program(path)
    value_types = Counter(str(t.dtype.value) for t in program.types.values())
    param_dtypes = Counter(p.type.dtype.value for p in program.params)
    data = {
        "file": str(path),
        "name": program.name,
        "fingerprint": fingerprint(program),
        "nodes": len(program.nodes),
        "ops": program.op_histogram(),
        "value_dtypes": dict(sorted(value_types.items())),
        "inputs": [{"name": v.name, "type": str(v.type)} for v in program.inputs],
        "outputs": [{"name": v.name, "type": str(v.type)} for v in program.output_values],
        "params": {
            "tensors": len(program.params),
            "count": program.param_count(),
            "bytes": program.param_bytes(),
            "dtypes": dict(sorted(param_dtypes.items())),
        },
        "meta": dict(program.meta),
        "provenance": provenance_summary(path, program),
    }
    return program, data


@click.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--text", "show_text", is_flag=True, help="Also print the program's text form.")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def inspect(file: Path, show_text: bool, as_json: bool) -> None:
    """Summarise FILE.difir: op histogram, types, parameter count and bytes, fingerprint, provenance."""
    program, data = describe(file)
    if show_text:
        from dif.serialize.text import print_program

        data["text"] = print_program(program)
    if as_json:
        emit_document("inspect", data)
        return
    click.echo(f"{data['name']}  ({data['file']})")
    click.echo(f"  fingerprint {data['fingerprint']}, {data['nodes']} nodes")
    click.echo(f"  ops: {', '.join(f'{op} ({n})' for op, n in data['ops'].items()) or '-'}")
    for key in ("inputs", "outputs"):
        listed = ", ".join(f"{v['name']}: {v['type']}" for v in data[key])
        click.echo(f"  {key}: {listed or '-'}")
    p = data["params"]
    click.echo(
        f"  params: {p['tensors']} tensors, {p['count']:,} values, {human_bytes(p['bytes'])} "
        f"({', '.join(f'{k} ({v})' for k, v in p['dtypes'].items()) or '-'})"
    )
    prov = data["provenance"]
    if prov is None:
        click.echo("  provenance: none recorded")
    else:
        click.echo(
            f"  provenance ({prov['source']}): {prov['nodes']}/{prov['nodes_in_program']} nodes, "
            f"modules: {', '.join(prov['modules'][:8]) or '-'}"
        )
    if show_text:
        click.echo()
        click.echo(data["text"])
