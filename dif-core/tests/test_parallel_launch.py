"""dif.parallel.launch without GPUs: the torchrun-style environment, the launcher's processes, one rank's
loop with a communicator (threads standing in for processes, exchanging through queues), and the NCCL
module's GPU-free parts (it imports without cupy; the rendezvous over loopback TCP). The NCCL collectives
themselves need two GPUs: not run here."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from dif.errors import UsageError
from dif.parallel import ulysses
from dif.parallel.collectives import exchange_all_to_all
from dif.parallel.launch import RankEnv, launch, prepare_rank, rank_environments, run_rank
from dif.runtime import get_backend

sys.path.insert(0, str(Path(__file__).parent))  # the tiny klein case and exact-GEMM fixture of test_parallel
from test_parallel import case, row_invariant_linear, single_device  # noqa: E402, F401


def test_rank_env_from_torchrun_variables() -> None:
    env = RankEnv.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "7"})
    assert env == RankEnv(3, 4, 1, "n0", 7)
    assert RankEnv.from_env({}) == RankEnv(0, 1, 0, "127.0.0.1", 29500)
    with pytest.raises(UsageError, match="RANK=4 is outside"):
        RankEnv.from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(UsageError, match="WORLD_SIZE='two'"):
        RankEnv.from_env({"WORLD_SIZE": "two"})


def test_launch_starts_one_process_per_rank(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(tmp_path)!r}, 'r' + os.environ['RANK']).write_text("
        "os.environ['WORLD_SIZE'] + ' ' + os.environ['LOCAL_RANK'] + ' ' + os.environ['MASTER_PORT'])\n"
    )
    assert launch(3, [sys.executable, str(script)]) == 0
    seen = sorted(p.name for p in tmp_path.glob("r*"))
    assert seen == ["r0", "r1", "r2"]
    ports = {(tmp_path / n).read_text().split()[2] for n in seen}
    assert len(ports) == 1 and all((tmp_path / f"r{r}").read_text().startswith(f"3 {r}") for r in range(3))
    assert len(rank_environments(2)) == 2
    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    assert launch(2, [sys.executable, str(bad)]) == 3


class ThreadComm:
    """A communicator between threads: each collective meets at a barrier, exchanged in-process."""

    def __init__(self, rank: int, shared: dict) -> None:  # type: ignore[type-arg]
        self.rank, self.world, self.shared = rank, shared["world"], shared

    def _meet(self, x: np.ndarray, combine) -> object:  # type: ignore[no-untyped-def]
        s = self.shared
        s["slots"][self.rank] = x
        if s["barrier"].wait() == 0:
            s["result"] = combine(list(s["slots"]))
        s["barrier"].wait()
        out = s["result"]
        s["barrier"].wait()
        return out

    def all_to_all(self, x: np.ndarray, *, split_axis: int, concat_axis: int) -> np.ndarray:
        ys = self._meet(x, lambda xs: exchange_all_to_all(xs, split_axis=split_axis, concat_axis=concat_axis))
        return ys[self.rank]  # type: ignore[index]

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        return self._meet(x, lambda xs: xs)  # type: ignore[return-value]


@pytest.mark.usefixtures("row_invariant_linear")
def test_run_rank_with_a_communicator_equals_one_device() -> None:

    program, weights, feeds = case(heads=4)
    want = single_device(program, weights, feeds)
    plan = ulysses(program, 2, {"latents": 1, "text_features": 1})
    backend = get_backend("cpu")
    prepared = [prepare_rank(plan, r, weights, backend) for r in range(2)]
    shared = {"world": 2, "slots": [None, None], "barrier": threading.Barrier(2)}
    outs: dict[int, dict] = {}  # type: ignore[type-arg]

    def rank(r: int) -> None:
        outs[r] = run_rank(plan, r, prepared[r], feeds, ThreadComm(r, shared))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    name = program.outputs[0]
    for r in range(2):  # every rank ends with the whole output (all_gather)
        assert np.array_equal(outs[r][name], want)


def test_nccl_module_imports_without_cupy_and_rendezvous_works() -> None:
    nccl = pytest.importorskip("dif_backend_cuda.nccl", reason="the NCCL communicator lives in dif-backend-cuda")
    parts = nccl.split_parts(np.arange(12.0).reshape(2, 6), 3, 1)
    assert [p.shape for p in parts] == [(2, 2)] * 3 and all(p.flags.c_contiguous for p in parts)
    with pytest.raises(Exception, match="does not split into 4"):
        nccl.split_parts(np.zeros((2, 6)), 4, 1)
    from dif.parallel.launch import free_port

    port, got = free_port(), {}
    uid = tuple(range(-64, 64))  # cupy's ids are signed chars

    def rank(r: int) -> None:
        got[r] = nccl.rendezvous(r, 3, "127.0.0.1", port, lambda: uid)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {0: uid, 1: uid, 2: uid}
