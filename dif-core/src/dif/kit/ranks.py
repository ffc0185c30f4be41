"""`dif NAME generate --gpus N`: one run over N rank processes (CFG-parallel, `dif.parallel.cfg`).

    dif flux2 generate --gpus 2 ...      the request is checked here, then `dif.parallel.launch.launch`
                                         starts this command again as ranks 0 and 1 (torchrun's variables)
    each rank (or torchrun's processes)  meets the others (`dif.parallel.host.HostCommunicator`), takes rank 0's
                                         seed, runs the pipeline with its `CfgParallel`; rank 0 writes the
                                         files and prints, the others write and print nothing

Where it sits: between `dif.kit.commands` (the click command) and `dif.cli_support.generate_image`. The
velocities cross host memory once per step (they are host arrays on every backend), so the exchange needs no
device collective. Device backends must say how many devices they see (`BackendInfo.devices`) and put rank
r on device LOCAL_RANK; host backends (the CPU, the interpreter) run every rank on this machine's cores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from attrs import frozen

from dif.errors import UsageError
from dif.parallel.cfg import check_cfg_parallel
from dif.parallel.launch import RankEnv

if TYPE_CHECKING:
    from dif.image_pipeline import TextToImagePipeline

HOST_BACKENDS = ("cpu", "interp")
"""Backends whose ranks share the host (no device to place a rank on): the CPU stand-in for GPUs."""


@frozen
class RankMode:
    """How this `generate --gpus` process runs: "single" (one process, as without --gpus), "launch" (start
    `gpus` rank processes and wait for them) or "rank" (one of them, `env`)."""

    kind: Literal["single", "launch", "rank"]
    gpus: int
    env: RankEnv


def rank_mode(gpus: int | None, environ: Any = None) -> RankMode:
    """The mode of `--gpus gpus` here: started by a launcher (torchrun's WORLD_SIZE > 1) this process is a
    rank, and `--gpus` must name the same count; otherwise `--gpus` > 1 launches. `UsageError` for a count
    below 1 or one that disagrees with WORLD_SIZE."""
    env = RankEnv.from_env(environ)
    if gpus is None:
        return RankMode("single", 1, RankEnv(0, 1, 0, env.master_addr, env.master_port))
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: at least 1")
    if env.world > 1:
        if gpus != env.world:
            raise UsageError(f"--gpus {gpus}, but this process was launched as one of WORLD_SIZE={env.world} ranks")
        return RankMode("rank", gpus, env)
    return RankMode("single" if gpus == 1 else "launch", gpus, env)


def check_devices(backend: str, gpus: int, devices: int | None) -> None:
    """`UsageError` unless `backend` can hold `gpus` ranks: a host backend always can; a device backend
    needs `devices` (what its `BackendInfo.devices` says this process sees) >= `gpus`."""
    if backend in HOST_BACKENDS:
        return
    if devices is None:
        raise UsageError(
            f"--gpus {gpus}: backend '{backend}' does not say how many devices it sees (BackendInfo.devices), "
            "so its ranks cannot be placed one per device",
            hint="run with --gpus 1, or --backend cpu to check the split on the host",
        )
    if gpus > devices:
        raise UsageError(
            f"--gpus {gpus}: backend '{backend}' sees {devices} device{'s' if devices != 1 else ''}",
            hint=f"at most --gpus {devices} here (the backend's devices: CUDA_VISIBLE_DEVICES selects them for CUDA)",
        )


def backend_devices(backend: str) -> int | None:
    """The devices `backend` says this process sees (`BackendInfo.devices`), None when it does not say."""
    from dif.plugins import backends

    info = backends().get(backend)
    return None if info is None or info.devices is None else int(info.devices())


def check_split(pipe: TextToImagePipeline, req: Any, gpus: int) -> None:
    """`UsageError` unless `req` on `pipe` can run over `gpus` ranks: CFG on (`check_cfg_parallel`), the
    kit's denoise loop (a pipeline with its own does not take `cfg_parallel`), devices for the ranks."""
    from dif.image_pipeline import TextToImagePipeline

    _, guidance, cfg, _ = pipe.resolve(req)
    check_cfg_parallel(gpus, cfg=cfg, guidance=guidance)
    if type(pipe).denoise is not TextToImagePipeline.denoise:
        raise UsageError(f"--gpus {gpus}: this model's pipeline runs its own sampling loop (no CFG-parallel)")
    name = pipe.backend_name
    check_devices(name, gpus, None if name in HOST_BACKENDS else backend_devices(name))


def launch_ranks(gpus: int) -> int:
    """This command again as `gpus` rank processes (`dif.parallel.launch`); the first failing rank's exit
    status, or 0."""
    from dif.parallel.launch import launch, main_argv

    return launch(gpus, main_argv())


def run_rank_generate(mode: RankMode, opts: Any, pipe: TextToImagePipeline, **generate: Any) -> str:
    """One rank's `generate_image(opts, pipe, **generate)`: checked as the launcher checked it, connected to
    the other ranks, on rank 0's seed (a random one is drawn per process), with the pipeline's `cfg_parallel`
    set for the run. Returns what rank 0 prints, "" on the others."""
    import numpy as np
    from attrs import evolve

    from dif.cli_support import generate_image, request_of
    from dif.parallel.cfg import CfgParallel
    from dif.parallel.host import HostCommunicator

    check_split(pipe, request_of(opts, generate.get("inputs")), mode.gpus)
    with HostCommunicator.connect(mode.env) as comm:
        seed = int(comm.all_gather(np.array([opts.seed], np.int64))[0][0])
        if seed != opts.seed:
            opts = evolve(opts, settings={**opts.settings, "seed": seed})
        pipe.cfg_parallel = CfgParallel(mode.env.rank, comm)
        try:
            return generate_image(opts, pipe, rank=mode.env.rank, **generate)
        finally:
            pipe.cfg_parallel = None
