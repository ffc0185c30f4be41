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


def _decisions_naming(plan: Any, node: Any) -> list[dict[str, str]]:
    """Decisions of `plan` that name `node` ("node N") or one of its result values, as whole tokens."""
    import re

    subjects = [f"node {node.id}", *(r.name for r in node.results)]
    return [
        {"what": d.what, "why": d.why}
        for d in plan.decisions
        if any(re.search(rf"(?<![\w%.]){re.escape(s)}(?![\w.])", d.what) for s in subjects)
    ]


def source_view(
    path: Path,
    program: Any,
    *,
    provenance: Path | None,
    plan_path: Path | None,
    trace_paths: tuple[Path, ...],
    op: int | None,
) -> dict[str, Any]:
    """Per op: semantic (the op table's definition), frontend provenance (module / block / section,
    checkpoint tensors), compiler transforms and the plan's decisions that name it, and the backend
    implementation the trace observed. A link that is not available is reported absent, with why."""
    from dif.fingerprint import fingerprint
    from dif.ir.program import Provenance
    from dif.ops.registry import OPS
    from dif.serialize.provenance import load_provenance

    fp = fingerprint(program)
    links: dict[str, Any] = {}
    if provenance is not None:
        records = load_provenance(provenance, program=program)
        links["provenance"] = {"source": str(provenance)}
    else:
        sidecar = next((p for p in sidecar_candidates(path) if p.is_file()), None)
        records = load_provenance(sidecar, program=program) if sidecar is not None else dict(program.provenance)
        records = {k: v for k, v in records.items() if v != Provenance()}
        where = str(sidecar) if sidecar is not None else "embedded"
        links["provenance"] = {"source": where} if records else {"absent": "no provenance recorded for this program"}
    plan = None
    if plan_path is not None:
        from dif.plan.difplan import load_plan

        plan = load_plan(plan_path)
        if plan.program_fingerprint != fp:
            links["plan"] = {"absent": f"{plan_path} is a plan for another program ({plan.program_fingerprint})"}
            plan = None
        else:
            links["plan"] = {"source": str(plan_path)}
    else:
        links["plan"] = {"absent": "no --plan given"}
    events: dict[int, list[dict[str, Any]]] = {}
    if trace_paths:
        from dif.trace.attribute import op_events, read_traces

        docs = read_traces(trace_paths)
        events = op_events(docs, fp)
        traced = sorted({d["data"].get("fingerprint", "") for d in docs})
        links["trace"] = (
            {
                "source": [str(t) for t in trace_paths],
                "executions": sum(1 for d in docs if d["data"].get("fingerprint") == fp),
            }
            if events
            else {
                "absent": f"the trace has no execution of this program ({fp}); it holds {', '.join(traced) or 'none'}"
            }
        )
    else:
        links["trace"] = {"absent": "no --trace given"}
    nodes = program.nodes
    if op is not None:
        if op not in program.node_by_id:
            from dif.errors import UsageError

            raise UsageError(f"{path} has no op {op} (ops 0..{len(nodes) - 1})")
        nodes = (program.node_by_id[op],)
    rows = []
    for node in nodes:
        prov = records.get(node.id)
        row: dict[str, Any] = {
            "op_id": node.id,
            "opcode": node.op,
            "semantic": OPS.get(node.op).doc.splitlines()[0] if node.op in OPS else None,
            "results": [{"name": r.name, "type": str(r.type)} for r in node.results],
            "operands": list(node.operands),
        }
        if prov is None:
            row["frontend"] = {"absent": "no provenance recorded for this op"}
        else:
            row["frontend"] = {
                "module": prov.module,
                "block": prov.block,
                "section": prov.section,
                "frontend_revision": prov.frontend_revision,
                "checkpoint_tensors": list(prov.tensors),
            }
            row["transforms"] = list(prov.transforms)
        params = {p.name for p in program.params}
        row["weights"] = [o for o in node.operands if o in params]
        if plan is not None:
            step = plan.schedule.index(node.id)
            row["plan"] = {
                "schedule_step": step,
                "placement": plan.placement[step],
                "weights": {w: plan.residency.get(w, "absent") for w in row["weights"]},
                "decisions": _decisions_naming(plan, node),
            }
        else:
            row["plan"] = {"absent": links["plan"]["absent"]}
        seen = events.get(node.id)
        if seen:
            impls = sorted({e.get("impl", "") for e in seen if e.get("impl")})
            row["backend"] = {
                "implementations": impls or [],
                "kind": seen[0].get("kind"),
                "executions": len(seen),
                "ms_median": sorted(e["ms"] for e in seen)[len(seen) // 2],
            }
            if not impls:
                row["backend"]["absent"] = "the trace's events name no implementation"
        else:
            row["backend"] = {"absent": links["trace"].get("absent", "the trace has no event of this op")}
        rows.append(row)
    return {"fingerprint": fp, "links": links, "ops": rows}


def _print_source(view: dict[str, Any]) -> None:
    for key, link in view["links"].items():
        click.echo(f"{key}: {link.get('source', '') or 'absent: ' + link.get('absent', '')}")
    for row in view["ops"]:
        click.echo(f"op {row['op_id']} {row['opcode']}: {row['semantic'] or '(not in the op table)'}")
        fe = row["frontend"]
        if "absent" in fe:
            click.echo(f"  frontend: absent ({fe['absent']})")
        else:
            where = "/".join(p for p in (fe["module"], fe["block"], fe["section"]) if p) or "-"
            click.echo(f"  frontend: {where}; checkpoint tensors: {', '.join(fe['checkpoint_tensors']) or '-'}")
            click.echo(f"  transforms: {', '.join(row['transforms']) or 'none recorded'}")
        pl = row["plan"]
        if "absent" in pl:
            click.echo(f"  plan: absent ({pl['absent']})")
        else:
            click.echo(f"  plan: step {pl['schedule_step']} on {pl['placement']}; weights {pl['weights'] or '-'}")
            for d in pl["decisions"]:
                click.echo(f"    - {d['what']}")
        be = row["backend"]
        if "implementations" in be:
            click.echo(f"  backend: {', '.join(be['implementations']) or '-'} ({be['kind']}, {be['ms_median']:.4f} ms)")
        else:
            click.echo(f"  backend: absent ({be['absent']})")


@click.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--text", "show_text", is_flag=True, help="Also print the program's text form.")
@click.option("--source", "show_source", is_flag=True, help="Per op: provenance, transforms, decisions, backend.")
@click.option("--provenance", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Sidecar to use.")
@click.option("--plan", "plan_path", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--trace", "trace_paths", multiple=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--op", "op_id", default=None, type=int, help="Only this op id (with --source).")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def inspect(
    file: Path,
    show_text: bool,
    show_source: bool,
    provenance: Path | None,
    plan_path: Path | None,
    trace_paths: tuple[Path, ...],
    op_id: int | None,
    as_json: bool,
) -> None:
    """Summarise FILE.difir: op histogram, types, parameter count and bytes, fingerprint, provenance.
    With --source, navigate each op (or --op ID) from the frontend's record through the plan (--plan) to
    the backend implementation a trace (--trace, a DIF_TRACE_FILE file) observed."""
    program, data = describe(file)
    if show_text:
        from dif.serialize.text import print_program

        data["text"] = print_program(program)
    if show_source or op_id is not None:
        data["source"] = source_view(
            file, program, provenance=provenance, plan_path=plan_path, trace_paths=trace_paths, op=op_id
        )
    if as_json:
        emit_document("inspect", data)
        return
    if "source" in data:
        _print_source(data["source"])
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
