"""`dif serve`: an OpenAI-style HTTP endpoint over one warm pipeline: `POST /v1/images/generations` for an
image model, `POST /v1/videos/generations` for a video model (MiniMax-H3).

The checkpoint (`--model`: a path, an HF repo id, or a frontend's name for its embedded tiny checkpoint, e.g.
`h3`; default: the embedded tiny FLUX.2 klein) is loaded and, unless --no-warmup, prepared with one short
generation before the port opens; requests then run one at a time from a queue of at most
--queue waiting jobs (429 past it), each answered within --timeout seconds (504 past it). With --replicas N
the same queue feeds N pipelines in Ray actors (--ray local, or a cluster's address), one request each.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document


def _model_id(model: str | None, family: str) -> str:
    return Path(model).name if model is not None else f"{family}-embedded"


def _embedded(model: str | None, family: str | None) -> tuple[str | None, str | None]:
    """(model, family) with `--model NAME` read as the embedded checkpoint of the installed frontend NAME
    (`--model h3`), unless a file or folder of that name exists here."""
    if model is None or Path(model).exists():
        return model, family
    from dif.plugins import frontends

    if model in frontends():
        if family is not None and family != model:
            raise click.UsageError(
                f"--model {model} names the {model} frontend's embedded model, not --family {family}"
            )
        return None, model
    return model, family


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option("--model", default=None,
              help="Checkpoint folder, file, HF repo id, or a frontend's name for its embedded model: h3")  # fmt: skip
@click.option("--family", default=None, help="Frontend family (default: detected; flux2 without --model).")
@click.option("--backend", default=None, help="Backend name (default: the best available).")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "f32", "bf16", "f16"]))
@click.option("--queue", "queue_size", default=16, show_default=True, type=click.IntRange(1, 100000),
              help="Waiting requests held; one more is answered 429.")  # fmt: skip
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, type=click.FloatRange(min=0.001),
              help="Seconds a request may wait and run before it is answered 504.")  # fmt: skip
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where images / videos are written (default: a new temporary folder).")  # fmt: skip
@click.option("--lora-dir", default=None, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Adapters a request may select by file stem (FLUX.2: unmerged, swapped per request).")  # fmt: skip
@click.option("--replicas", default=0, type=click.IntRange(0, 4096),
              help="Pipelines in Ray actors (0: one pipeline in this process).")  # fmt: skip
@click.option("--ray", "ray_address", default="local", show_default=True,
              help="With --replicas: 'local' or a Ray cluster's address (auto, ray://host:10001).")  # fmt: skip
@click.option("--gpus-per-replica", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="With --replicas: GPUs Ray reserves per replica (1 for --backend cuda).")  # fmt: skip
@click.option("--warmup/--no-warmup", default=True, show_default=True,
              help="Prepare with one short generation before serving.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document once listening.")
def serve(
    host: str,
    port: int,
    model: str | None,
    family: str | None,
    backend: str | None,
    dtype: str,
    queue_size: int,
    timeout_s: float,
    out_dir: Path | None,
    lora_dir: Path | None,
    replicas: int,
    ray_address: str,
    gpus_per_replica: float,
    warmup: bool,
    as_json: bool,
) -> None:
    """Serve images (or videos, for a video model) over HTTP until interrupted (Ctrl-C)."""
    import dif
    from dif_tools.serve.app import GENERATIONS, ServeSettings, build_app
    from dif_tools.serve.generate import warmup as warm
    from dif_tools.serve.server import bind, make_server
    from dif_tools.serve.worker import PipelineWorker

    model, family = _embedded(model, family)

    options: dict[str, Any] = {"lora_mode": "unmerged"} if lora_dir is not None else {}

    def load() -> Any:
        return dif.load(model, family=family, backend=backend, dtype=dtype, **options)

    folder = out_dir if out_dir is not None else Path(tempfile.mkdtemp(prefix="dif-serve-"))
    ray = None
    if replicas:
        from dif_tools.serve.batch import LoadSpec, init_ray
        from dif_tools.serve.replicas import RayReplicas

        if lora_dir is not None:
            raise click.UsageError("--lora-dir works with one in-process pipeline, not with --replicas")
        ray = init_ray(ray_address, replicas)
        spec = LoadSpec(model, family, backend, dtype)
        worker: PipelineWorker = RayReplicas(
            load, folder, queue_size=queue_size, spec=spec, replicas=replicas, ray=ray,
            gpus_per_replica=gpus_per_replica,
        )  # fmt: skip
    else:
        worker = PipelineWorker(load, folder, queue_size=queue_size, lora_dir=lora_dir)
    sock = bind(host, port)  # before the load: a taken port fails at once
    worker.start(warmup=warm if warmup else None)
    model_id = _model_id(model, family or "flux2") if replicas else _model_id(model, worker.pipeline.family)
    app = build_app(worker, ServeSettings(model_id, timeout_s, worker.kind))
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://{bound_host}:{bound_port}"
    info = {"url": url, "model": model_id, "kind": worker.kind, "endpoint": url + GENERATIONS[worker.kind],
            "queue": queue_size, "timeout_s": timeout_s, "out": str(folder), "replicas": max(replicas, 1)}  # fmt: skip
    if as_json:
        emit_document("serve", info)
    else:
        where = f", {replicas} Ray replicas" if replicas else ""
        click.echo(f"serving {model_id} at {info['endpoint']} (queue {queue_size}, timeout {timeout_s:g} s{where})")
        click.echo(f"{worker.kind}s in {folder}")
    try:
        make_server(app, sock).run(sockets=[sock])
    finally:
        worker.stop()
        sock.close()
        if ray is not None:
            ray.shutdown()
