"""The warm pipeline(s) of `dif serve` and the bounded queue in front of them.

Where it sits: between the HTTP app (`dif_tools.serve.app`) and `dif.load`'s pipeline, for an image or a
video model alike (a job is made and saved by `dif_tools.serve.generate`). A runner thread takes one job at
a time from the queue: `PipelineWorker` has one, over the pipeline it loaded in this
process (a pipeline's prepared programs are not shared across threads); `dif_tools.serve.replicas` has one
per Ray actor, each actor with its own pipeline. The queue holds at most `queue_size` waiting jobs, so
`submit` refuses a job (`QueueFull`, the app's 429) instead of letting latency grow without bound. A job whose
caller stopped waiting (its timeout) is cancelled: it is never started and frees its place in the queue at
once.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from attrs import define, field, frozen

from dif.errors import UsageError
from dif_tools.serve.generate import GeneratedFile, JobRequest, generate_files, model_kind, request_kind
from dif_tools.serve.requests import BadRequest, ImageJobRequest, LoraChoice

__all__ = ["GeneratedFile", "Job", "JobResult", "PipelineWorker", "QueueFull", "Runner", "WrongKind"]


class QueueFull(Exception):
    """The request queue holds its bound of waiting jobs."""


class WrongKind(BadRequest):
    """A request of one kind (image, video) to a server whose model makes the other."""

    def __init__(self, served: str, asked: str) -> None:
        super().__init__(f"this server serves a {served} model, not {asked}s")
        self.served, self.asked = served, asked


@frozen
class JobResult:
    id: str
    files: tuple[GeneratedFile, ...]
    queued_s: float  # from submit to start
    run_s: float  # the pipeline call and the saves
    worker: str = ""  # which pipeline ran it (host:pid)


@define
class Job:
    id: str
    request: JobRequest
    future: Future[JobResult]
    submitted: float


Runner = Callable[[Job], tuple[tuple[GeneratedFile, ...], str]]
"""Runs one job: (the files it wrote, the name of the pipeline that ran it)."""


@define
class PipelineWorker:
    """Runs requests on the pipeline `load()` returns (called once, in `start`); `kind` ("image" | "video")
    is what that pipeline makes, known once it is loaded, and a request of the other kind is refused.

    `out_dir`: where files are written (`<job id>-<i>.png`, `<job id>.mp4`); `lora_dir`: the adapters an image
    request may name (`NAME.safetensors`), None: requests may not select LoRAs."""

    load: Callable[[], Any]
    out_dir: Path
    queue_size: int = 16
    lora_dir: Path | None = None
    pipeline: Any = None
    kind: str = "image"
    served: int = 0
    failed: int = 0
    _queue: deque[Job | None] = field(init=False, factory=deque)
    _ready: threading.Condition = field(init=False, factory=threading.Condition)
    _threads: list[threading.Thread] = field(init=False, factory=list)
    _loras: tuple[LoraChoice, ...] = field(default=(), init=False)
    _count: threading.Lock = field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        if self.queue_size < 1:
            raise UsageError(f"--queue {self.queue_size}: the queue holds at least 1 job")

    @property
    def ready(self) -> bool:
        return bool(self._threads)

    @property
    def waiting(self) -> int:
        """Jobs queued and still wanted (not yet started, caller still waiting)."""
        with self._ready:
            return sum(1 for j in self._queue if j is not None and not j.future.cancelled())

    def start(self, *, warmup: Callable[[Any], None] | None = None) -> None:
        """Load (and with `warmup`, prepare) the pipeline here, then start the runner thread."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.pipeline = self.load()
        self.kind = model_kind(self.pipeline)
        if self.kind == "video" and self.lora_dir is not None:
            raise UsageError("--lora-dir: the video model takes no LoRA selection", hint="leave --lora-dir out")
        if warmup is not None:
            warmup(self.pipeline)
        self.start_runners([self._run])

    def start_runners(self, runners: list[Runner]) -> None:
        for i, runner in enumerate(runners):
            thread = threading.Thread(target=self._loop, args=(runner,), name=f"dif-serve-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        with self._ready:
            self._queue.extend([None] * len(self._threads))  # after the jobs already queued, one per runner
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def submit(self, request: JobRequest) -> Future[JobResult]:
        """Queue `request`; `WrongKind` for a request the model does not make, `QueueFull` when `queue_size`
        jobs already wait."""
        if request_kind(request) != self.kind:
            raise WrongKind(self.kind, request_kind(request))
        if isinstance(request, ImageJobRequest) and request.lora and self.lora_dir is None:
            raise UsageError("this server takes no LoRA selection", hint="start dif serve with --lora-dir DIR")
        job = Job(uuid.uuid4().hex, request, Future(), time.perf_counter())
        with self._ready:
            live = [j for j in self._queue if j is None or not j.future.cancelled()]
            if len(live) >= self.queue_size:
                raise QueueFull(f"{self.queue_size} requests are waiting")
            self._queue = deque([*live, job])
            self._ready.notify()
        return job.future

    def _next(self) -> Job | None:
        with self._ready:
            while not self._queue:
                self._ready.wait()
            return self._queue.popleft()

    def _loop(self, runner: Runner) -> None:
        while (job := self._next()) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue  # its caller timed out while it waited
            started = time.perf_counter()
            try:
                files, worker = runner(job)
            except BaseException as exc:  # handed to the waiting request; the runner goes on
                with self._count:
                    self.failed += 1
                job.future.set_exception(exc)
                continue
            with self._count:
                self.served += 1
            elapsed = time.perf_counter() - started
            job.future.set_result(JobResult(job.id, files, started - job.submitted, elapsed, worker))

    def _select_loras(self, wanted: tuple[LoraChoice, ...]) -> None:
        if wanted == self._loras:
            return
        assert self.lora_dir is not None
        specs = []
        for choice in wanted:
            path = self.lora_dir / f"{choice.name}.safetensors"
            if not path.is_file():
                raise UsageError(f"no LoRA '{choice.name}' in {self.lora_dir}", hint="name a NAME.safetensors there")
            specs.append((path, choice.scale))
        self.pipeline.set_loras(specs)
        self._loras = wanted

    def _run(self, job: Job) -> tuple[tuple[GeneratedFile, ...], str]:
        if self.lora_dir is not None and isinstance(job.request, ImageJobRequest):
            self._select_loras(job.request.lora)
        return generate_files(self.pipeline, job.request, self.out_dir, job.id), f"local:{os.getpid()}"
