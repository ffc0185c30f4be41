"""One process per GPU: the torchrun-style environment of a rank, the launcher that starts N of them, and
the loop that runs one rank's program with a communicator's all-to-all.

    python SCRIPT --gpus N ...   ->  launch(N, [python, SCRIPT, ...])  ->  N processes with
        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (what torchrun sets too),
        CUDA_VISIBLE_DEVICES left alone: rank r uses device LOCAL_RANK
    each rank: RankEnv.from_env() -> a communicator (dif_backend_cuda.nccl) -> run_rank(plan, rank, ...)

dif-core imports no backend: the communicator is handed in (anything with `all_to_all(x, split_axis,
concat_axis)` and `all_gather(x)` over host arrays).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from attrs import frozen

from dif.errors import UsageError
from dif.parallel.segments import Collective, cut
from dif.parallel.ulysses import ParallelPlan

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Communicator(Protocol):
    rank: int
    world: int

    def all_to_all(self, x: np.ndarray, *, split_axis: int, concat_axis: int) -> np.ndarray: ...

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]: ...


@frozen
class RankEnv:
    """Where this process sits: global rank, world size, rank on its node, the rendezvous address."""

    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        """From torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); without
        them, rank 0 of 1. `UsageError` naming a variable that is malformed or out of range. Under torchrun's
        elastic agent with its shared store (TORCHELASTIC_USE_AGENT_STORE=True, torch >= 2.4's default),
        MASTER_PORT is the agent's own TCP store, already listening: dif's rendezvous takes the next port."""
        env = os.environ if env is None else env

        def num(name: str, default: int) -> int:
            text = env.get(name)
            if text is None:
                return default
            try:
                return int(text)
            except ValueError:
                raise UsageError(f"{name}={text!r} is not an integer") from None

        world, rank = num("WORLD_SIZE", 1), num("RANK", 0)
        local = num("LOCAL_RANK", rank)
        if world < 1 or not 0 <= rank < world:
            raise UsageError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
        if local < 0:
            raise UsageError(f"LOCAL_RANK={local} is negative")
        port = num("MASTER_PORT", 29500) + (env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")
        return cls(rank, world, local, env.get("MASTER_ADDR", "127.0.0.1"), port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environments(gpus: int, *, master_addr: str = "127.0.0.1", master_port: int | None = None) -> list[dict]:
    """The environment variables of each of `gpus` ranks on this node."""
    if gpus < 1:
        raise UsageError(f"--gpus {gpus}: at least 1")
    port = master_port or free_port()
    return [
        {"RANK": str(r), "WORLD_SIZE": str(gpus), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(gpus),
         "MASTER_ADDR": master_addr, "MASTER_PORT": str(port)}
        for r in range(gpus)
    ]  # fmt: skip


def launch(gpus: int, argv: Sequence[str], *, poll_s: float = 0.05) -> int:
    """Run `argv` as `gpus` processes (one per GPU of this node), each with its rank's environment; 0 when
    all succeed. When one fails, the others (waiting on it at a collective) are terminated and the failed
    rank's exit status is returned."""
    import time

    procs = [subprocess.Popen(list(argv), env={**os.environ, **e}) for e in rank_environments(gpus)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = next((c for c in codes if c not in (None, 0)), None)
            if failed is not None:
                return failed
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_rank(
    plan: ParallelPlan,
    rank: int,
    prepared: Sequence[Any],
    feeds: Mapping[str, np.ndarray],
    comm: Communicator,
) -> dict[str, np.ndarray]:
    """Run rank `rank`'s program: `prepared[k]` is the executable of its k-th segment (None for a collective,
    `prepare_rank`), collectives through `comm`. Returns every output whole on every rank (`all_gather`)."""
    from dif.parallel.local import gather

    program = plan.programs[rank]
    env = dict(feeds)
    for step, exe in zip(cut(program), prepared, strict=True):
        if isinstance(step, Collective):
            split, concat = step.axes
            env[step.node.results[0].name] = comm.all_to_all(
                env[step.node.operands[0]], split_axis=split, concat_axis=concat
            )
        else:
            env.update(exe.run({name: env[src] for name, src in step.feeds.items()}))
    out = {}
    for i, (name, sharding) in enumerate(plan.output_shardings.items()):
        local = env[program.outputs[i]]
        out[name] = local if sharding is None else gather(comm.all_gather(local), sharding)
    return out


def prepare_rank(plan: ParallelPlan, rank: int, weights: Mapping[str, np.ndarray], backend: Any) -> list[Any]:
    """The executables of rank `rank`'s segments on `backend` (an instance), None at each collective."""
    from dif.parallel.local import prepare_segment

    out: list[Any] = []
    for step in cut(plan.programs[rank]):
        out.append(
            None if isinstance(step, Collective) else prepare_segment(step.program, weights, backend, plan.decisions)[0]
        )
    return out


def main_argv() -> list[str]:
    """This process's command line, to start it again as each rank."""
    return [sys.executable, *sys.argv]
