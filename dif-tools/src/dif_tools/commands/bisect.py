"""`dif bisect pairs|manifest|program|validate-oracle`: the first boundary where dif's captured tensors
leave an oracle's, judged against explicit bars, with the unobserved span before it (`dif.bisect`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


def bar_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The bars every bisect subcommand takes."""
    opts = [
        click.option("--min-cosine", default=0.999, show_default=True, type=float),
        click.option("--max-rel-l2", default=1e-2, show_default=True, type=float),
        click.option("--max-norm-ratio-deviation", default=1e-2, show_default=True, type=float),
        click.option("--max-abs", default=None, type=float, help="Off unless given."),
        click.option("--allow-nonfinite-mismatch", is_flag=True, help="Do not fail on differing NaN/inf positions."),
        click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _bars(kw: dict[str, Any]) -> Any:
    from dif.bisect.metrics import Bars

    return Bars(
        min_cosine=kw.pop("min_cosine"),
        max_rel_l2=kw.pop("max_rel_l2"),
        max_norm_ratio_deviation=kw.pop("max_norm_ratio_deviation"),
        max_abs=kw.pop("max_abs"),
        nonfinite_must_match=not kw.pop("allow_nonfinite_mismatch"),
    )


def _emit(report: dict[str, Any], as_json: bool, **extra: Any) -> None:
    from dif.bisect.report import summary_line

    data = {**extra, **report}
    if as_json:
        emit_document("bisect", data)
        return
    rows = []
    for b in report["boundaries"]:
        m = b.get("metrics") or {}
        cos = f"{m['cosine']:.6f}" if m.get("cosine") is not None else "-"
        rel = f"{m['rel_l2']:.3e}" if m.get("rel_l2") is not None else "-"
        note = "; ".join(b.get("broken", [])) or (f"missing in {', '.join(b['missing'])}" if "missing" in b else "")
        rows.append([b["name"], b["status"], cos, rel, note[:90]])
    if rows:
        click.echo(table(["boundary", "status", "cosine", "rel_l2", "why"], rows))
    click.echo(summary_line(report))


def _tensors(path: Path) -> tuple[dict[str, Any], Any]:
    """(tensors, the capture or None) of a tensor file."""
    from dif.bisect.fixtures import load_capture
    from dif.errors import FormatError
    from dif.serialize.diftensor import load_tensors

    try:
        capture = load_capture(path)
        return capture.tensors, capture
    except FormatError as exc:
        if "not a dif capture" not in str(exc):
            raise
    return dict(load_tensors(path)[0]), None


@click.group("bisect")
def bisect() -> None:
    """Find the first divergence between dif's captures (DIF_CAPTURE) and an oracle."""


@bisect.command("pairs")
@click.argument("candidate", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("reference", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--order", default=None, help="Comma-separated tensor names in semantic order (default: the capture's).")
@bar_options
def bisect_pairs(candidate: Path, reference: Path, order: str | None, **kw: Any) -> None:
    """Compare same-named tensors of CANDIDATE and REFERENCE in --order (or the candidate capture's order)."""
    from dif.bisect.report import Boundary
    from dif.bisect.report import bisect as run_bisect
    from dif.errors import UsageError

    as_json = kw.pop("as_json")
    bars = _bars(kw)
    cand, cap = _tensors(candidate)
    ref, _ = _tensors(reference)
    if order is not None:
        names = [n.strip() for n in order.split(",") if n.strip()]
        source = "--order"
    elif cap is not None:
        names, source = list(cap.order), f"capture order of {candidate}"
    else:
        raise UsageError(f"{candidate} is not a dif capture, so it has no order of its own", hint="give --order a,b,c")
    if not names:
        raise UsageError("--order names no tensor")
    boundaries = [Boundary(n, n, n) for n in names]
    _emit(run_bisect(boundaries, cand, ref, bars, order_source=source), as_json, candidate=str(candidate))


@bisect.command("manifest")
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--capture", "capture_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@bar_options
def bisect_manifest(manifest: Path, capture_path: Path, **kw: Any) -> None:
    """Compare a capture against an oracle fixture in the manifest's boundary order (its `dif` keys)."""
    from dif.bisect.fixtures import load_oracle
    from dif.bisect.report import Boundary
    from dif.bisect.report import bisect as run_bisect

    as_json = kw.pop("as_json")
    bars = _bars(kw)
    fixture, oracle = load_oracle(manifest)
    cand, _ = _tensors(capture_path)
    boundaries = [Boundary(b.name, b.dif, b.tensor, {"oracle_tensor": b.tensor}) for b in fixture.boundaries]
    report = run_bisect(boundaries, cand, oracle, bars, order_source=f"manifest {manifest}")
    _emit(report, as_json, manifest=str(manifest), capture=str(capture_path), producer=fixture.producer)


@bisect.command("program")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--capture", "capture_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--reference",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Oracle tensors by the program's value names (another capture, e.g. of the cpu backend, or a fixture).",
)
@bar_options
def bisect_program(file: Path, capture_path: Path, reference: Path, **kw: Any) -> None:
    """Boundaries in the producer order of FILE.difir (the program the capture was taken of), every
    result of every node; a value missing on either side is not observed."""
    from dif.bisect.fixtures import load_capture
    from dif.bisect.report import Boundary
    from dif.bisect.report import bisect as run_bisect
    from dif.errors import UsageError
    from dif.fingerprint import fingerprint
    from dif.serialize.difir import load_program

    as_json = kw.pop("as_json")
    bars = _bars(kw)
    program = load_program(file)
    capture = load_capture(capture_path)
    fp = fingerprint(program)
    if capture.fingerprint != fp:
        raise UsageError(
            f"{capture_path} captures program '{capture.program}' ({capture.fingerprint}), not {file} ({fp})",
            hint="capture the program the runtime executed (dif trace program --save-program writes it)",
        )
    ref, _ = _tensors(reference)
    boundaries = []
    for node in program.nodes:
        prov = program.provenance.get(node.id)
        block = "/".join(p for p in (prov.module, prov.block) if p) if prov is not None else ""
        for value in node.results:
            info = {"op_id": node.id, "opcode": node.op, **({"block": block} if block else {})}
            boundaries.append(Boundary(value.name, value.name, value.name, info))
    report = run_bisect(boundaries, capture.tensors, ref, bars, order_source=f"producer order of {file}")
    first = report["first_failed"]
    if first is not None:
        row = next(b for b in report["boundaries"] if b["name"] == first)
        report["first_failed_op"] = {"op_id": row["op_id"], "opcode": row["opcode"], "block": row.get("block", "")}
    if report["verdict"] == "nothing observed":
        raise UsageError(f"no value of {file} is in both {capture_path} and {reference}")
    _emit(report, as_json, program=program.name, capture=str(capture_path), reference=str(reference))


@bisect.command("validate-oracle")
@click.argument("manifest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def validate_oracle_cmd(manifest: Path, as_json: bool) -> None:
    """Check an oracle-fixture manifest: schema, its tensors file, every named tensor present with the stated
    shape and dtype."""
    from dif.bisect.fixtures import validate_oracle

    data = validate_oracle(manifest)
    if as_json:
        emit_document("bisect.validate-oracle", data)
        return
    rows = [
        [b["name"], b["tensor"], b["dif"] or "-", b["shape"], b["dtype"], b["nonfinite"]] for b in data["boundaries"]
    ]
    click.echo(table(["boundary", "tensor", "dif", "shape", "dtype", "non-finite"], rows))
    click.echo(f"ok: {len(rows)} boundaries, tensors in {data['tensors']} (made by {data['producer'].get('library')})")
