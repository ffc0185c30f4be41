"""`dif serve --replicas N --ray ADDRESS|local`: the same queue and HTTP app, N pipelines in Ray actors.

Where it sits: a `PipelineWorker` whose runners are Ray actors (`dif_tools.serve.batch.GenerateWorker`, the
one `dif batch` uses) instead of a pipeline in this process: one runner thread per actor takes the next
queued job, the actor generates it and sends the file's bytes back (PNGs, or an MP4 for a video model), and
the files are written here. Actors
may be on other nodes of a Ray cluster; the HTTP front and the files stay on this machine. A replica that
dies is replaced before its runner takes another job (the job it held answers 500).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import define, field

from dif.errors import UsageError
from dif_tools.serve.batch import BatchJob, GenerateWorker, LoadSpec, write_atomic
from dif_tools.serve.generate import GeneratedFile, warmup_request
from dif_tools.serve.worker import Job, PipelineWorker, Runner


@define
class RayReplicas(PipelineWorker):
    """`replicas` Ray actors, each loading `spec` once; `ray` is the initialised ray module."""

    spec: LoadSpec = field(kw_only=True, factory=LoadSpec)
    replicas: int = field(kw_only=True, default=2)
    ray: Any = field(kw_only=True, default=None)
    gpus_per_replica: float = field(kw_only=True, default=0.0)
    names: list[str] = field(init=False, factory=list)

    def start(self, *, warmup: Any = None) -> None:
        """Start the actors and wait until each has loaded (and with `warmup`, prepared) its pipeline."""
        if self.lora_dir is not None:
            raise UsageError("--lora-dir works with one in-process pipeline, not with --replicas")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        actor_cls = self.ray.remote(num_cpus=1, num_gpus=self.gpus_per_replica)(GenerateWorker)
        actors = [actor_cls.remote(self.spec) for _ in range(self.replicas)]
        self.names = list(self.ray.get([a.ping.remote() for a in actors]))
        self.kind = self.ray.get(actors[0].kind.remote())  # every replica loads the same spec
        if warmup is not None:  # one short generation at the default size on every replica
            probe = BatchJob("warm-up", 0, warmup_request(self.kind))
            self.ray.get([a.run.remote(probe) for a in actors])
        self.pipeline = actors
        self.start_runners([self._remote(actor_cls, a) for a in actors])

    def _remote(self, actor_cls: Any, actor: Any) -> Runner:
        holder = [actor]

        def run(job: Job) -> tuple[tuple[GeneratedFile, ...], str]:
            try:
                result = self.ray.get(holder[0].run.remote(BatchJob(job.id, 0, job.request)))
            except self.ray.exceptions.RayActorError:
                holder[0] = actor_cls.remote(self.spec)  # a fresh replica for the next job
                raise
            except self.ray.exceptions.RayTaskError as exc:  # the pipeline's own error, as in-process
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, BaseException) else exc) from None
            files = []
            for made in result["files"]:  # named after the job's id by the actor, as in-process
                path = Path(self.out_dir) / made["name"]
                write_atomic(path, made["data"])
                files.append(GeneratedFile(made["name"], path, int(made["seed"]), made["settings"]))
            return tuple(files), result["worker"]

        return run
