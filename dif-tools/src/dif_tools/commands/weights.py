"""`dif weights stats MODEL`: per tensor of a checkpoint, its count, min, max, mean and how many
values are NaN or infinite (the load-time scan `dif.weights.bind.check_finite_weights` refuses
those; this command shows where they are).

MODEL is a .safetensors file, a sharded index (.json), a component folder (transformer/) or a
diffusers folder, whose component folders are read in name order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


def open_sources(model: Path, variant: str | None) -> list[tuple[str, Any]]:
    """(component name or "", tensor source) of each weights file set under `model`."""
    from dif.errors import CheckpointError
    from dif.weights import open_component, open_index, open_safetensors

    if model.is_file():
        return [("", open_index(model) if model.suffix == ".json" else open_safetensors(model))]
    try:
        return [("", open_component(model, variant=variant))]
    except CheckpointError as direct:
        found = []
        for sub in sorted(p for p in model.iterdir() if p.is_dir()):
            try:
                found.append((sub.name, open_component(sub, variant=variant)))
            except CheckpointError:
                continue  # a folder without weights (tokenizer/, scheduler/)
        if not found:
            raise direct from None
        return found


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


@click.group("weights")
def weights() -> None:
    """Look at a checkpoint's tensors."""


@weights.command("stats")
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@click.option("--variant", help="Weight files to read, e.g. fp16 (diffusion_pytorch_model.fp16.safetensors).")
@click.option("--threads", type=click.IntRange(1, None), help="Scan threads (default: one per CPU core).")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def stats(model: Path, variant: str | None, threads: int | None, as_json: bool) -> None:
    """Count, min, max, mean and non-finite values of every tensor in MODEL."""
    from dif.weights.scan import tensor_stats

    start = time.perf_counter()
    rows = []
    for component, source in open_sources(model, variant):
        for s in tensor_stats(source, threads=threads):
            rows.append((f"{component}/{s.name}" if component else s.name, s))
    seconds = time.perf_counter() - start
    bad = [(name, s) for name, s in rows if s.nonfinite]
    if as_json:
        tensors = [
            {
                "name": name,
                "file": s.file,
                "dtype": s.dtype,
                "shape": list(s.shape),
                "count": s.count,
                "min": s.min,
                "max": s.max,
                "mean": s.mean,
                "nan": s.nan,
                "inf": s.inf,
            }
            for name, s in rows
        ]
        data = {"model": str(model), "tensors": tensors, "nonfinite_tensors": len(bad), "seconds": round(seconds, 4)}
        emit_document("weights.stats", data)
        return
    headers = ("tensor", "dtype", "shape", "count", "min", "max", "mean", "nan", "inf")
    cells = [
        (name, s.dtype, "x".join(map(str, s.shape)) or "scalar", s.count, _number(s.min), _number(s.max))
        + (_number(s.mean), s.nan, s.inf)
        for name, s in rows
    ]
    click.echo(table(headers, cells))
    verdict = f"{len(bad)} hold NaN / infinite values" if bad else "all finite"
    click.echo(f"{len(rows)} tensors, {sum(s.count for _, s in rows)} values: {verdict} ({seconds:.2f} s)")
