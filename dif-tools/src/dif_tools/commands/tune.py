"""`dif tune`: a backend's candidates for each tunable problem of a program (GEMM, attention, convolution)
with their verdicts, and the library choices a backend has stored (`dif.tune`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


@click.command("tune")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", "backend_name", default=None, help="Backend name (default: DIF_BACKEND or the best).")
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(1, 1000), help="Timed calls per candidate.")
@click.option("--force", is_flag=True, help="Measure again instead of reusing stored verdicts.")
@click.option("--report", "report_path", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def tune(
    file: Path | None, backend_name: str | None, repeat: int, force: bool, report_path: Path | None, as_json: bool
) -> None:
    """With FILE.difir: judge the backend's candidates for each distinct GEMM / attention / convolution
    problem of it (runs, matches the reference, then fastest) and store the verdicts for reuse. Always:
    list the library choices stored in the cache (the cuda backend's cuBLASLt / cuDNN picks, DIF_CUDA_TUNE).
    --report writes the document to a file as well."""
    from dif.env import DIF_CUDA_TUNE, cache_dir
    from dif.runtime import get_backend
    from dif.serialize.container import write_atomic
    from dif.telemetry import build_document, dumps, hardware_entry
    from dif.tune import stored_choices, tune_program

    rows = []
    hardware = []
    name = backend_name
    if file is not None:
        from dif.serialize.difir import load_program

        program = load_program(file)
        backend = get_backend(backend_name, program=program)
        name = str(backend.name)
        rows = tune_program(program, backend, repeat=repeat, force=force)
        hardware = [hardware_entry(name, profile=backend.profile())]
    choices_dir = cache_dir() / "cuda" / "choices"
    entries = stored_choices(choices_dir)
    data: dict[str, Any] = {
        "file": str(file) if file is not None else None,
        "backend": name,
        "problems": rows,
        "stored_library_choices": {
            "folder": str(choices_dir),
            "mode": DIF_CUDA_TUNE.get(),
            "entries": entries,
        },
    }
    doc = build_document("tune", tool="dif tune", data=data, hardware=hardware)
    if report_path is not None:
        write_atomic(report_path, (dumps(doc) + "\n").encode())
    if as_json:
        emit_document("tune", data, hardware=hardware)
        return
    out = []
    for r in rows:
        for c in r["candidates"]:
            ms = f"{c['ms_median']:.4f}" if "ms_median" in c else "-"
            out.append([r["problem"][:70], c["candidate"][:40], c["verdict"], ms, r["source"]])
    if out:
        click.echo(table(["problem", "candidate", "verdict", "ms", "source"], out))
    click.echo(f"stored library choices in {choices_dir}: {len(entries)} (DIF_CUDA_TUNE={DIF_CUDA_TUNE.get()})")
