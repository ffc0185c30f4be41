"""A communicator over TCP between rank processes, for arrays that live on the host: the CFG-parallel
guidance exchange (one velocity per step) on any backend, and the CPU backend's stand-in for NCCL.

    rank 0 listens near MASTER_ADDR:MASTER_PORT, ranks 1..P-1 connect (`HostCommunicator.connect(RankEnv)`)
    all_gather(x) / all_to_all(x): every rank sends its array to rank 0, which answers each with its share

A star through rank 0, each message a JSON header (shape, dtype name) and the raw bytes: small, and enough
for a few megabytes per step; the device-to-device collectives of a split denoiser are NCCL's
(`dif_backend_cuda.nccl`). A peer that exits closes its socket, so the others stop with a `DifError`
instead of waiting for ever.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import numpy as np

from dif.errors import DifError
from dif.parallel.collectives import exchange_all_to_all
from dif.parallel.launch import RankEnv
from dif.parallel.rendezvous import meet, read_exact

CONNECT_TIMEOUT_S = 120.0


def _send(sock: socket.socket, x: np.ndarray) -> None:
    x = np.ascontiguousarray(x)
    head = json.dumps({"shape": list(x.shape), "dtype": x.dtype.name}).encode()
    sock.sendall(len(head).to_bytes(4, "big") + head + x.nbytes.to_bytes(8, "big") + x.tobytes())


def _recv(sock: socket.socket, like: np.ndarray, rank: int) -> np.ndarray:
    """One array; its dtype must be `like`'s (every rank runs the same program, so it is)."""
    head = json.loads(read_exact(sock, int.from_bytes(read_exact(sock, 4, rank), "big"), rank))
    data = read_exact(sock, int.from_bytes(read_exact(sock, 8, rank), "big"), rank)
    if head["dtype"] != like.dtype.name:
        raise DifError(f"rank {rank}: a peer sent {head['dtype']}, this rank holds {like.dtype.name}")
    return np.frombuffer(data, dtype=like.dtype).reshape(head["shape"]).copy()


class HostCommunicator:
    """Rank `rank` of `world`, connected to the others through rank 0 (see the module docstring). Has the
    `dif.parallel.launch.Communicator` methods; `close()` (or `with`) ends the connections."""

    def __init__(self, rank: int, world: int, peers: list[socket.socket]) -> None:
        self.rank, self.world = rank, world
        self._peers = peers  # rank 0: the sockets of ranks 1..P-1 in order; others: [the socket to rank 0]

    @classmethod
    def connect(cls, env: RankEnv, *, timeout_s: float = CONNECT_TIMEOUT_S) -> HostCommunicator:
        """Meet the other ranks of `env` (`dif.parallel.rendezvous.meet`: rank 0 serves near MASTER_PORT, the
        others retry until `timeout_s`); `DifError` when they do not all arrive in time."""
        return cls(env.rank, env.world, meet(env, timeout_s=timeout_s))

    def _through_root(self, x: np.ndarray, answer: Callable[[list[np.ndarray]], list[np.ndarray]]) -> np.ndarray:
        """Rank 0 collects every rank's `x` (in rank order), computes `answer(xs)` (one array per rank) and
        sends each rank its own; returns this rank's."""
        if self.world == 1:
            return answer([x])[0]
        if self.rank != 0:
            _send(self._peers[0], x)
            return _recv(self._peers[0], x, self.rank)
        xs = [x, *(_recv(peer, x, 0) for peer in self._peers)]
        ys = answer(xs)
        for peer, y in zip(self._peers, ys[1:], strict=True):
            _send(peer, y)
        return ys[0]

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's `x`, in rank order (same shape and dtype on every rank)."""
        joined = self._through_root(x, lambda xs: [np.stack(xs)] * len(xs))
        return list(joined)

    def all_to_all(self, x: np.ndarray, *, split_axis: int, concat_axis: int) -> np.ndarray:
        """`x` cut into `world` parts along `split_axis`, part j sent to rank j, the parts received joined
        along `concat_axis` (`dif.parallel.collectives.exchange_all_to_all`)."""
        return self._through_root(x, lambda xs: exchange_all_to_all(xs, split_axis=split_axis, concat_axis=concat_axis))

    def close(self) -> None:
        for peer in self._peers:
            peer.close()
        self._peers = []

    def __enter__(self) -> HostCommunicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
