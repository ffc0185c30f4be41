"""`dif batch PROMPTS.jsonl --ray ADDRESS|local --out DIR`: many generate jobs across Ray workers.

Each line of PROMPTS.jsonl is a `dif serve` request body (prompt, n, size, seed, steps, guidance,
negative_prompt, sampler, scheduler) with an optional "id". See `dif_tools.serve.batch`.
"""

from __future__ import annotations

from pathlib import Path

import click

from dif_tools.output import emit_document


@click.command("batch")
@click.argument("jobs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--ray", "address", required=True, help="A Ray cluster's address (ray://host:10001, auto), or 'local'.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for <id>.png, <id>.json and batch.json.")  # fmt: skip
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 4096),
              help="Ray actors, each with one warm pipeline.")  # fmt: skip
@click.option("--gpus-per-worker", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="GPUs Ray reserves per worker (1 for --backend cuda on a GPU cluster).")  # fmt: skip
@click.option("--retries", default=2, show_default=True, type=click.IntRange(0, 100), help="Retries of a failed job.")
@click.option("--model", default=None, help="Checkpoint every worker loads (default: the embedded one).")
@click.option("--family", default=None, help="Frontend family (default: detected; flux2 without --model).")
@click.option("--backend", default=None, help="Backend name (default: the best available on each worker).")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "f32", "bf16", "f16"]))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document at the end.")
def batch(
    jobs_file: Path,
    address: str,
    out_dir: Path,
    workers: int,
    gpus_per_worker: float,
    retries: int,
    model: str | None,
    family: str | None,
    backend: str | None,
    dtype: str,
    as_json: bool,
) -> None:
    """Run every job of JSONL_FILE; exit 1 when any job still failed after its retries."""
    from dif_tools.serve.batch import LoadSpec, init_ray, read_jobs, run_batch

    jobs = read_jobs(jobs_file)  # a bad line stops the run before any worker starts
    ray = init_ray(address, workers)

    def progress(result: dict) -> None:
        if not as_json:
            note = "ok" if result["status"] == "ok" else f"FAILED after {result['attempts']} attempts"
            click.echo(f"{result['id']}: {note}", err=True)

    try:
        summary = run_batch(
            jobs, out_dir, ray=ray, spec=LoadSpec(model, family, backend, dtype), workers=workers,
            retries=retries, gpus_per_worker=gpus_per_worker, on_done=progress,
        )  # fmt: skip
    finally:
        ray.shutdown()
    if as_json:
        emit_document("batch", summary)
    else:
        click.echo(
            f"{summary['completed']}/{summary['jobs']} jobs completed on {summary['workers']} workers "
            f"in {summary['wall_s']:.1f} s; {summary['failed']} failed; results in {out_dir}"
        )
        for f in summary["failures"]:
            click.echo(f"  {f['id']} (line {f['line']}): {f['errors'][-1]}")
    if summary["failed"]:
        raise click.exceptions.Exit(1)
