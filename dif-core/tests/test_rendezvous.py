"""The ranks' meeting point (`dif.parallel.rendezvous`): a taken MASTER_PORT, a stranger's server on it,
two jobs on neighbouring ports, and a rank 0 that never comes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import numpy as np
import pytest

from dif.errors import DifError
from dif.parallel.host import HostCommunicator
from dif.parallel.launch import RankEnv, free_port
from dif.parallel.rendezvous import meet


def _ranks(world: int, port: int, body: Callable[[HostCommunicator], object]) -> dict[int, object]:
    """Run `body` on each rank of a job of `world` threads at `port`; their results by rank."""
    got: dict[int, object] = {}

    def rank(r: int) -> None:
        try:
            with HostCommunicator.connect(RankEnv(r, world, r, "127.0.0.1", port), timeout_s=30) as comm:
                got[r] = body(comm)
        except Exception as exc:  # reported by the assertion below, with the rank
            got[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got


def _gather_rank(comm: HostCommunicator) -> list[int]:
    return [int(v[0]) for v in comm.all_gather(np.array([comm.rank]))]


def test_ranks_meet_past_a_port_that_is_taken() -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # listening, never answering: rank 0 cannot bind it
        got = _ranks(3, port, _gather_rank)
    assert got == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}


def test_ranks_skip_a_stranger_that_answers_something_else() -> None:
    port = free_port()
    stranger = socket.create_server(("127.0.0.1", port))
    stop = threading.Event()

    def answer_wrongly() -> None:
        stranger.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = stranger.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 64)

    server = threading.Thread(target=answer_wrongly)
    server.start()
    try:
        got = _ranks(2, port, _gather_rank)
    finally:
        stop.set()
        server.join(5)
        stranger.close()
    assert got == {0: [0, 1], 1: [0, 1]}


def test_two_jobs_on_neighbouring_ports_stay_apart() -> None:
    """Job B's MASTER_PORT is job A's + 1, inside A's span: the greeting names the job, so no rank crosses."""
    port = free_port()
    results: dict[str, dict[int, object]] = {}

    def job(name: str, base: int, offset: int) -> None:
        results[name] = _ranks(
            2, base, lambda comm: [int(v[0]) for v in comm.all_gather(np.array([offset + comm.rank]))]
        )

    jobs = [threading.Thread(target=job, args=("a", port, 0)), threading.Thread(target=job, args=("b", port + 1, 10))]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join(90)
    assert results == {"a": {0: [0, 1], 1: [0, 1]}, "b": {0: [10, 11], 1: [10, 11]}}


def test_a_rank_whose_rank_0_never_comes_says_so() -> None:
    port = free_port()
    with pytest.raises(DifError, match=rf"rank 1: rank 0 did not answer at 127.0.0.1:{port}\.\.{port + 15}"):
        meet(RankEnv(1, 2, 1, "127.0.0.1", port), timeout_s=0.5)


def _connect_to_itself(address: tuple[str, int], timeout: float) -> socket.socket:
    """What the kernel may hand a connect to a free ephemeral port: a socket bound to that same port,
    connected to itself (TCP's simultaneous open), which echoes whatever it sends."""
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind(address)
    sock.connect(address)
    return sock


def test_a_connection_to_itself_is_not_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI once saw a rank 1 with no rank 0 return from `meet`: one of its connects reached itself and read
    its own greeting back. Here every connect does."""
    port = free_port()
    monkeypatch.setattr("dif.parallel.rendezvous.socket.create_connection", _connect_to_itself)
    with pytest.raises(DifError, match="rank 1: rank 0 did not answer"):
        meet(RankEnv(1, 2, 1, "127.0.0.1", port), timeout_s=0.2)


def test_rank_0_alone_times_out_naming_its_port() -> None:
    port = free_port()
    with pytest.raises(DifError, match=rf"rank 0: 1 ranks did not connect to 127.0.0.1:{port} within"):
        meet(RankEnv(0, 2, 0, "127.0.0.1", port), timeout_s=0.3)
