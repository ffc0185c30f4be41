"""CFG-parallel without GPUs: the host TCP communicator between threads standing in for rank processes, the
kit's sampling loop split over two ranks (equal to one process exactly, every sampler, both combine rules),
and the `generate --gpus` decisions (rank mode, device counts, the CFG check)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dif.errors import DifError, UsageError
from dif.kit.ranks import check_devices, rank_mode
from dif.kit.sampling import sample
from dif.parallel.cfg import CfgParallel, check_cfg_parallel
from dif.parallel.collectives import exchange_all_to_all
from dif.parallel.host import HostCommunicator
from dif.parallel.launch import RankEnv, free_port
from dif.sched import FlowMatchSchedule, with_sampling


def on_ranks(world: int, body: Callable[[HostCommunicator], Any]) -> list[Any]:
    """body(comm) on `world` threads, each a rank connected over loopback TCP; their results by rank."""
    port, out, errors = free_port(), [None] * world, []

    def rank(r: int) -> None:
        try:
            with HostCommunicator.connect(RankEnv(r, world, r, "127.0.0.1", port), timeout_s=30) as comm:
                out[r] = body(comm)
        except Exception as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


def test_host_communicator_all_gather_and_all_to_all() -> None:
    xs = [np.arange(24, dtype=np.float32).reshape(2, 12) + 100 * r for r in range(3)]

    def body(comm: HostCommunicator) -> tuple[list[np.ndarray], np.ndarray]:
        x = xs[comm.rank]
        return comm.all_gather(x), comm.all_to_all(x, split_axis=1, concat_axis=0)

    got = on_ranks(3, body)
    want = exchange_all_to_all(xs, split_axis=1, concat_axis=0)
    for r in range(3):
        gathered, exchanged = got[r]
        assert all(np.array_equal(a, b) for a, b in zip(gathered, xs, strict=True))
        assert np.array_equal(exchanged, want[r])


def test_host_communicator_peer_gone_is_an_error() -> None:
    def body(comm: HostCommunicator) -> None:
        if comm.rank == 1:
            comm.close()  # rank 1 leaves without its part of the gather
            return
        comm.all_gather(np.zeros(3, np.float32))

    with pytest.raises(DifError, match="closed its connection"):
        on_ranks(2, body)


def schedule(sampler: str) -> FlowMatchSchedule:
    sigmas = np.array([1.0, 0.75, 0.4, 0.1, 0.0], np.float32)
    base = FlowMatchSchedule(sigmas=sigmas, timesteps=(sigmas[:-1] * 1000).astype(np.float32), mu=None)
    return with_sampling(base, sampler=sampler)


def predict(x: np.ndarray, t: Any, cond: np.ndarray) -> np.ndarray:
    """A stand-in denoiser: nonlinear in x, t and the conditioning, float32 throughout."""
    return (np.tanh(x * cond) - np.float32(t) / np.float32(1000) * x + cond).astype(np.float32)


@pytest.mark.parametrize("sampler", ["euler", "heun", "dpm++2m"])
@pytest.mark.parametrize("cfg_base", ["uncond", "cond"])
def test_cfg_parallel_sampling_equals_one_process_exactly(sampler: str, cfg_base: Any) -> None:
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((2, 6, 4)).astype(np.float32)
    cond, uncond = (rng.standard_normal((1, 6, 4)).astype(np.float32) for _ in range(2))
    sched = schedule(sampler)
    want = sample(x0, sched, predict, cond, uncond=uncond, guidance=3.5, cfg_base=cfg_base)
    calls: list[list[Any]] = [[], []]

    def body(comm: HostCommunicator) -> np.ndarray:
        def counted(x: np.ndarray, t: Any, c: np.ndarray) -> np.ndarray:
            calls[comm.rank].append(c is cond)
            return predict(x, t, c)

        split = CfgParallel(comm.rank, comm)
        return sample(x0, sched, counted, cond, uncond=uncond, guidance=3.5, cfg_base=cfg_base, cfg_parallel=split)

    got = on_ranks(2, body)
    assert np.array_equal(got[0], want) and np.array_equal(got[1], want)
    assert calls[0] and all(calls[0]) and not any(calls[1])  # rank 0 ran only cond, rank 1 only uncond
    assert len(calls[0]) == len(calls[1]) == (7 if sampler == "heun" else 4)


def test_cfg_parallel_decision_and_refusals() -> None:
    split = CfgParallel(1, comm=None)
    assert split.branch == "uncond" and split.record() == {
        "mode": "cfg",
        "degree": 2,
        "branches": {"0": "cond", "1": "uncond"},
    }
    (decision,) = split.decisions()
    assert decision.pass_name == "cfg_parallel" and "rank 0: cond, rank 1: uncond" in decision.reason
    with pytest.raises(UsageError, match="outside 0..1"):
        CfgParallel(2, comm=None)
    check_cfg_parallel(2, cfg=True, guidance=4.0)
    with pytest.raises(UsageError, match="CFG is off for this run \\(guidance 1"):
        check_cfg_parallel(2, cfg=False, guidance=1.0)
    with pytest.raises(UsageError, match="--gpus 4: generate splits a run over 2 ranks"):
        check_cfg_parallel(4, cfg=True, guidance=4.0)
    with pytest.raises(UsageError, match="needs the uncond"):
        sample(np.zeros((1, 2, 2), np.float32), schedule("euler"), predict, None, cfg_parallel=split)


def test_rank_mode_and_devices() -> None:
    assert rank_mode(None, {"WORLD_SIZE": "2", "RANK": "1"}).kind == "single"  # --gpus not asked: one process
    assert rank_mode(1, {}).kind == "single" and rank_mode(2, {}).kind == "launch"
    mode = rank_mode(2, {"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "1234"})
    assert mode.kind == "rank" and mode.env.rank == 1 and mode.env.master_port == 1234
    with pytest.raises(UsageError, match="WORLD_SIZE=4"):
        rank_mode(2, {"WORLD_SIZE": "4", "RANK": "0"})
    with pytest.raises(UsageError, match="at least 1"):
        rank_mode(0, {})
    check_devices("cpu", 2, None)  # host ranks share the machine
    with pytest.raises(UsageError, match="does not say how many devices"):
        check_devices("cuda", 2, None)
    with pytest.raises(UsageError, match="sees 1 device\\n"):
        check_devices("cuda", 2, 1)
    check_devices("cuda", 2, 2)


def test_launch_stops_the_other_ranks_when_one_fails(tmp_path: Any) -> None:
    """Rank 1 fails at once; rank 0 would wait for it (here: sleep) and is terminated, its status not returned."""
    import sys
    import time

    from dif.parallel.launch import launch

    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n")
    start = time.monotonic()
    assert launch(2, [sys.executable, str(script)]) == 3
    assert time.monotonic() - start < 30


def test_rank_env_under_torchrun_agent_store_takes_the_next_port() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert RankEnv.from_env(env).master_port == 29501  # 29500 is torch's own store
    assert RankEnv.from_env({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}).master_port == 29500
