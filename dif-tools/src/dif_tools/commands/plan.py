"""`dif plan make|show|diff|residency|explain|check`: what the compiler decided for a program, read from a
`.difplan` (its recorded decisions and placement data). A subject no decision names is reported as
such; nothing is inferred after the fact."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, human_bytes, table


def _load(path: Path) -> Any:
    from dif.plan.difplan import load_plan

    return load_plan(path)


def _summary(plan: Any) -> dict[str, Any]:
    b = plan.binding
    return {
        "program": plan.program_name,
        "program_fingerprint": plan.program_fingerprint,
        "binding": {
            "compiler_revision": b.compiler_revision,
            "target_backend": b.target_backend,
            "target_fingerprint": b.target_fingerprint,
            "target_device": b.target_profile.device,
            "budget_class": b.budget_class,
            "min_memory_bytes": b.min_memory_bytes,
        },
        "precision": plan.precision,
        "nodes": len(plan.schedule),
        "buffers": len(plan.buffers),
        "arena_bytes": plan.arena_bytes,
        "peak_bytes": plan.peak_bytes,
        "param_bytes": plan.param_bytes,
        "resident_bytes": plan.resident_bytes,
        "staging_bytes": plan.staging_bytes,
        "streamed_params": len(plan.streamed),
        "stream_blocks": len(plan.streaming.blocks),
        "host_nodes": len(plan.host_nodes),
        "decisions": [{"what": d.what, "why": d.why} for d in plan.decisions],
    }


def _names(text: str, subject: str) -> bool:
    """Whether `text` names `subject` as a whole token (value `%12` does not match `%123`)."""
    return re.search(rf"(?<![\w%.]){re.escape(subject)}(?![\w.])", text) is not None


@click.group("plan")
def plan() -> None:
    """Read the decisions recorded in .difplan files."""


@plan.command("make")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", "backend_name", default=None, help="Backend name (default: DIF_BACKEND or the best).")
@click.option("--memory-budget", default=None, type=click.IntRange(min=1), help="Cap the free memory (bytes).")
@click.option(
    "--save-program",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the optimized program the plan is for (its op ids are the plan's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plan_make(
    file: Path,
    out_path: Path,
    backend_name: str | None,
    memory_budget: int | None,
    save_program: Path | None,
    as_json: bool,
) -> None:
    """Optimize and plan FILE.difir for a backend (no weights needed) and write OUT.difplan."""
    from dif.plan.difplan import save_plan
    from dif.plan.planner import plan_program
    from dif.runtime import capped_budget, get_backend, optimize_for
    from dif.serialize.difir import load_program
    from dif.serialize.difir import save_program as write_program

    program = load_program(file)
    backend = get_backend(backend_name, program=program)
    profile = backend.profile()
    budget = capped_budget(backend.budget(), memory_budget)
    optimized, decisions = optimize_for(program, backend, profile)
    made = plan_program(optimized, profile, budget, decisions=decisions)
    save_plan(made, out_path)
    if save_program is not None:
        write_program(optimized, save_program)
    data = {"file": str(out_path), **_summary(made)}
    if as_json:
        emit_document("plan.make", data)
        return
    click.echo(made.describe())
    click.echo(f"wrote {out_path}")


@plan.command("show")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plan_show(file: Path, as_json: bool) -> None:
    """The binding, memory figures and every recorded decision of FILE.difplan."""
    p = _load(file)
    data = {"file": str(file), **_summary(p)}
    if as_json:
        emit_document("plan.show", data)
        return
    click.echo(p.describe())


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in summary.items() if k not in ("binding", "decisions")}
    out.update({f"binding.{k}": v for k, v in summary["binding"].items()})
    return out


@plan.command("diff")
@click.argument("a", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plan_diff(a: Path, b: Path, as_json: bool) -> None:
    """What differs between two plans: figures and binding, residency per weight, buffer placement,
    schedule, and the decisions only one of them records."""
    pa, pb = _load(a), _load(b)
    fa, fb = _flat(_summary(pa)), _flat(_summary(pb))
    fields = [{"field": k, "a": fa[k], "b": fb[k]} for k in fa if fa[k] != fb[k]]
    residency = [
        {"param": n, "a": pa.residency.get(n, "absent"), "b": pb.residency.get(n, "absent")}
        for n in sorted(set(pa.residency) | set(pb.residency))
        if pa.residency.get(n) != pb.residency.get(n)
    ]
    ba, bb = pa.buffer_by_name, pb.buffer_by_name
    moved = sorted(n for n in set(ba) & set(bb) if (ba[n].offset, ba[n].size) != (bb[n].offset, bb[n].size))
    da = [(d.what, d.why) for d in pa.decisions]
    db = [(d.what, d.why) for d in pb.decisions]
    data = {
        "a": str(a),
        "b": str(b),
        "same_program": pa.program_fingerprint == pb.program_fingerprint,
        "fields": fields,
        "residency": residency,
        "buffers": {
            "only_a": sorted(set(ba) - set(bb)),
            "only_b": sorted(set(bb) - set(ba)),
            "moved": moved,
        },
        "same_schedule": pa.schedule == pb.schedule,
        "decisions_only_a": [{"what": w, "why": y} for w, y in da if (w, y) not in db],
        "decisions_only_b": [{"what": w, "why": y} for w, y in db if (w, y) not in da],
    }
    if as_json:
        emit_document("plan.diff", data)
        return
    if not data["same_program"]:
        click.echo("the plans are for different programs (fingerprints differ)")
    for f in fields:
        click.echo(f"{f['field']}: {f['a']} -> {f['b']}")
    for r in residency:
        click.echo(f"weight {r['param']}: {r['a']} -> {r['b']}")
    click.echo(f"buffers moved: {len(moved)}; schedule {'same' if data['same_schedule'] else 'differs'}")
    for d in data["decisions_only_a"]:
        click.echo(f"- {d['what']}")
    for d in data["decisions_only_b"]:
        click.echo(f"+ {d['what']}")


@plan.command("residency")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plan_residency(file: Path, as_json: bool) -> None:
    """Which weights stay resident and which stream (block, slot, first/last reader), with the
    admission arithmetic the planner recorded."""
    p = _load(file)
    offsets = p.streaming.offsets()
    block_of = {n: blk for blk in p.streaming.blocks for n in blk.params}
    weights = []
    for name, where in sorted(p.residency.items()):
        row: dict[str, Any] = {"param": name, "residency": where}
        blk = block_of.get(name)
        if blk is not None:
            row.update(block=blk.key, slot=blk.slot, staging_offset=offsets[name])
            row.update(first_use=blk.first_use, last_use=blk.last_use)
        weights.append(row)
    recorded = [{"what": d.what, "why": d.why} for d in p.decisions if d.what.startswith(("residency:", "streaming:"))]
    data = {
        "file": str(file),
        "param_bytes": p.param_bytes,
        "resident_bytes": p.resident_bytes,
        "staging_bytes": p.staging_bytes,
        "min_memory_bytes": p.binding.min_memory_bytes,
        "slots": p.streaming.slots,
        "slot_bytes": p.streaming.slot_bytes,
        "decisions": recorded,
        "weights": weights,
    }
    if as_json:
        emit_document("plan.residency", data)
        return
    for d in recorded or [{"what": "residency", "why": "no residency decision is recorded in this plan"}]:
        click.echo(f"{d['what']}\n  {d['why']}")
    click.echo(
        f"resident {human_bytes(p.resident_bytes)} of {human_bytes(p.param_bytes)}, staging "
        f"{human_bytes(p.staging_bytes)} ({p.streaming.slots} x {human_bytes(p.streaming.slot_bytes)})"
    )
    streamed = [[w["param"], w["block"], w["slot"], w["first_use"], w["last_use"]] for w in weights if "block" in w]
    if streamed:
        click.echo(table(["streamed weight", "block", "slot", "first use", "last use"], streamed))


def _buffer(p: Any, name: str) -> dict[str, Any] | None:
    b = p.buffer_by_name.get(name)
    if b is None:
        return None
    return {
        "offset": b.offset,
        "size": b.size,
        "nbytes": b.nbytes,
        "first_use": b.first_use,
        "last_use": b.last_use,
        "alias_of": b.alias_of,
    }


@plan.command("explain")
@click.argument("subject_kind", type=click.Choice(["tensor", "op"]))
@click.argument("subject")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--program", "program_path", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plan_explain(subject_kind: str, subject: str, file: Path, program_path: Path | None, as_json: bool) -> None:
    """What FILE.difplan records about one tensor (a weight or an intermediate value) or one op (by id):
    its placement data and the decisions that name it. --program (the planned program) adds the op's
    results and opcode."""
    from dif.errors import UsageError

    p = _load(file)
    program = None
    if program_path is not None:
        from dif.fingerprint import fingerprint
        from dif.serialize.difir import load_program

        program = load_program(program_path)
        if fingerprint(program) != p.program_fingerprint:
            raise UsageError(f"{program_path} is not the program {file} was planned for (fingerprints differ)")
    data: dict[str, Any] = {"file": str(file), "kind": subject_kind, "subject": subject}
    subjects = [subject]
    if subject_kind == "tensor":
        if subject in p.residency:
            blk = next((b for b in p.streaming.blocks if subject in b.params), None)
            data["weight"] = {"residency": p.residency[subject], "block": blk.key if blk else None}
        elif subject in p.buffer_by_name:
            data["buffer"] = _buffer(p, subject)
        else:
            raise UsageError(f"{file} has no weight or value named {subject!r}", hint="see `dif plan show`")
    else:
        try:
            op_id = int(subject)
        except ValueError:
            raise UsageError(f"op subject {subject!r} is not an op id (an integer)") from None
        if op_id not in p.schedule:
            raise UsageError(f"{file} schedules no op {op_id} (ops 0..{len(p.schedule) - 1})")
        step = p.schedule.index(op_id)
        data["op"] = {"op_id": op_id, "schedule_step": step, "placement": p.placement[step]}
        subjects = [f"node {op_id}"]
        if program is not None:
            node = program.node_by_id[op_id]
            data["op"]["opcode"] = node.op
            data["op"]["results"] = {r.name: _buffer(p, r.name) for r in node.results}
            subjects += [r.name for r in node.results]
    named = [{"what": d.what, "why": d.why} for d in p.decisions if any(_names(d.what, s) for s in subjects)]
    data["decisions"] = named
    data["recorded"] = bool(named)
    if not named:
        data["note"] = f"no decision recorded in {file.name} names {subject_kind} {subject}"
    if as_json:
        emit_document("plan.explain", data)
        return
    for key in ("weight", "buffer", "op"):
        if key in data:
            click.echo(f"{key}: {data[key]}")
    for d in named:
        click.echo(f"- {d['what']}\n    {d['why']}")
    if not named:
        click.echo(data["note"])


@plan.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--program", "program_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", "backend_name", default=None, help="Backend name (default: the plan's target).")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def plan_check(file: Path, program_path: Path, backend_name: str | None, as_json: bool) -> None:
    """Whether FILE.difplan may be replayed for PROGRAM on this host's backend; exit 1 naming every
    condition that changed (program, compiler, target, budget)."""
    from dif.plan.difplan import check_binding
    from dif.runtime import get_backend
    from dif.serialize.difir import load_program

    p = _load(file)
    program = load_program(program_path)
    from dif.errors import BackendUnavailableError

    try:
        backend = get_backend(backend_name or p.binding.target_backend)
    except BackendUnavailableError:
        if backend_name is not None:
            raise
        backend = get_backend(None, program=program)  # the plan's target is absent here: compare with this host's
    check_binding(p, program, backend.profile(), backend.budget())
    data = {"file": str(file), "program": str(program_path), "backend": backend.name, "replayable": True}
    if as_json:
        emit_document("plan.check", data)
        return
    click.echo(f"{file}: may be replayed on {backend.name}")
