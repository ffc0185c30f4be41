"""`dif batch`: a JSONL file of generation jobs run across Ray workers, one warm pipeline per worker.

Where it sits: beside `dif serve`, on the same request fields (`dif_tools.serve.requests`). The driver reads
the jobs, starts `workers` Ray actors (each calls `dif.load` once and keeps the pipeline), keeps one job in
flight per actor, and as each finishes writes OUT/<id>.png (or <id>-<i>.png for n > 1) and OUT/<id>.json
(settings, timings, worker, attempts), each by temp + rename; images travel back to the driver as PNG bytes,
so workers on other nodes need no shared folder. A job that raises is retried (on any worker) up to
`retries` times, then reported failed; a worker that dies is replaced. OUT/batch.json summarises the run.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from dif.errors import UsageError
from dif_tools.serve.generate import JobRequest
from dif_tools.serve.requests import BadRequest, ImageJobRequest, parse_request

_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@frozen
class BatchJob:
    id: str
    line: int
    request: JobRequest  # `dif batch` reads image requests; `dif serve --replicas` hands either kind


@frozen
class LoadSpec:
    """What every worker passes to `dif.load`."""

    model: str | None = None
    family: str | None = None
    backend: str | None = None
    dtype: str = "auto"


def read_jobs(path: Path) -> list[BatchJob]:
    """The jobs of a JSONL file: one object per line (blank lines skipped) with the serve request's fields
    and an optional "id" (default: job-<line>); `UsageError` naming the line of the first bad one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the jobs file: {exc.strerror}") from None
    jobs, seen = [], set()
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            body = json.loads(text)
            job_id = body.pop("id", None) if isinstance(body, dict) else None
            request = parse_request(body)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{number}: not JSON: {exc.msg}") from None
        except BadRequest as exc:
            raise UsageError(f"{path}:{number}: {' '.join(str(exc).split())}") from None
        job_id = f"job-{number:05d}" if job_id is None else str(job_id)
        if not job_id or not set(job_id) <= _ID_CHARS or job_id.startswith(".") or job_id in seen:
            raise UsageError(f"{path}:{number}: id {job_id!r} is not a unique plain name (letters, digits, _ . -)")
        seen.add(job_id)
        jobs.append(BatchJob(job_id, number, request))
    if not jobs:
        raise UsageError(f"{path}: no jobs in the file")
    return jobs


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class GenerateWorker:
    """A Ray actor's body: one pipeline, loaded once, run for every job handed to it."""

    def __init__(self, spec: LoadSpec) -> None:
        import dif

        started = time.perf_counter()
        self.pipe = dif.load(spec.model, family=spec.family, backend=spec.backend, dtype=spec.dtype)
        self.load_s = time.perf_counter() - started
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.jobs = 0

    def ping(self) -> str:
        """This worker's name, once its pipeline is loaded (callers wait on it)."""
        return self.name

    def kind(self) -> str:
        """What the pipeline makes: "image" or "video" (`dif_tools.serve.generate.model_kind`)."""
        from dif_tools.serve.generate import model_kind

        return model_kind(self.pipe)

    def run(self, job: BatchJob) -> dict[str, Any]:
        """One job: its files ({name, data: the bytes, seed, settings}, named after `job.id`), seconds."""
        from dif_tools.serve.generate import generate_files

        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:  # the bytes travel back: the driver may be on another node
            made = generate_files(self.pipe, job.request, Path(tmp), job.id)
            files = [
                {"name": f.name, "data": f.path.read_bytes(), "seed": f.seed, "settings": f.settings} for f in made
            ]
        self.jobs += 1
        return {
            "files": files, "run_s": time.perf_counter() - started,
            "worker": self.name, "worker_load_s": self.load_s, "worker_jobs": self.jobs,
        }  # fmt: skip


def image_names(job: BatchJob) -> list[str]:
    n = job.request.n if isinstance(job.request, ImageJobRequest) else 1  # `read_jobs` reads image requests only
    return [f"{job.id}.png"] if n == 1 else [f"{job.id}-{i}.png" for i in range(n)]


def _save(out: Path, job: BatchJob, result: Mapping[str, Any], attempts: int) -> dict[str, Any]:
    names = image_names(job)
    for name, made in zip(names, result["files"], strict=True):
        write_atomic(out / name, made["data"])
    meta = {
        "id": job.id, "line": job.line, "status": "ok", "images": names, "attempts": attempts,
        "settings": [f["settings"] for f in result["files"]], "run_s": round(result["run_s"], 4),
        "worker": result["worker"],
    }  # fmt: skip
    write_atomic(out / f"{job.id}.json", (json.dumps(meta, indent=2, default=str) + "\n").encode())
    return meta


def _failure(out: Path, job: BatchJob, errors: Sequence[str]) -> dict[str, Any]:
    meta = {"id": job.id, "line": job.line, "status": "failed", "attempts": len(errors), "errors": list(errors)}
    write_atomic(out / f"{job.id}.json", (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # RayTaskError keeps the worker's exception here
    inner = cause if isinstance(cause, BaseException) else exc
    return f"{type(inner).__name__}: {' '.join(str(inner).split())[:500]}"


def init_ray(address: str, workers: int) -> Any:
    """`ray.init` for `--ray local` (a cluster of this machine, `workers` CPUs) or a cluster's address."""
    try:
        import ray
    except ImportError:
        raise UsageError("dif batch needs Ray", hint="pip install ray (or: pip install 'dif-tools[batch]')") from None
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address == "local":
        ray.init(num_cpus=max(workers, 1), **kwargs)
    else:
        ray.init(address=address, **kwargs)
    return ray


def run_batch(
    jobs: Sequence[BatchJob],
    out: Path,
    *,
    ray: Any,
    spec: LoadSpec,
    workers: int = 2,
    retries: int = 2,
    gpus_per_worker: float = 0.0,
    on_done: Any = None,
) -> dict[str, Any]:
    """Run `jobs` on `workers` actors of the initialised `ray`; the summary (also OUT/batch.json)."""
    out.mkdir(parents=True, exist_ok=True)
    actor_cls = ray.remote(num_cpus=1, num_gpus=gpus_per_worker)(GenerateWorker)
    started = time.perf_counter()
    actors = [actor_cls.remote(spec) for _ in range(max(1, min(workers, len(jobs))))]
    pending = list(reversed(jobs))  # popped from the end: file order
    errors: dict[str, list[str]] = {j.id: [] for j in jobs}
    in_flight: dict[Any, tuple[BatchJob, Any]] = {}
    done: list[dict[str, Any]] = []
    idle = list(actors)
    while pending or in_flight:
        while pending and idle:
            job, actor = pending.pop(), idle.pop()
            in_flight[actor.run.remote(job)] = (job, actor)
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        job, actor = in_flight.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except Exception as exc:
            errors[job.id].append(_error_text(exc))
            if isinstance(exc, ray.exceptions.RayActorError):  # the worker died: a new one takes its place
                actor = actor_cls.remote(spec)
            idle.append(actor)
            if len(errors[job.id]) <= retries:
                pending.append(job)  # next in line, on whichever worker is free
            else:
                done.append(_failure(out, job, errors[job.id]))
                if on_done is not None:
                    on_done(done[-1])
            continue
        idle.append(actor)
        done.append(_save(out, job, result, len(errors[job.id]) + 1))
        if on_done is not None:
            on_done(done[-1])
    by_id = {d["id"]: d for d in done}
    ordered = [by_id[j.id] for j in jobs]
    failed = [d for d in ordered if d["status"] != "ok"]
    summary = {
        "jobs": len(jobs), "completed": len(jobs) - len(failed), "failed": len(failed),
        "failures": [{"id": d["id"], "line": d["line"], "errors": d["errors"]} for d in failed],
        "retried": sum(1 for d in ordered if d["attempts"] > 1), "workers": len(actors),
        "retries": retries, "wall_s": round(time.perf_counter() - started, 3),
        "per_worker_jobs": _per_worker(ordered), "results": ordered,
    }  # fmt: skip
    write_atomic(out / "batch.json", (json.dumps(summary, indent=2, default=str) + "\n").encode())
    return summary


def _per_worker(results: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        if r["status"] == "ok":
            counts[r["worker"]] = counts.get(r["worker"], 0) + 1
    return dict(sorted(counts.items()))
