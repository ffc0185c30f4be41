"""NCCL collectives for sequence-parallel rank programs (`dif.parallel`), through CuPy's `cupy.cuda.nccl`.

Where it sits: the communicator `dif.parallel.launch.run_rank` calls at each `all_to_all` of a rank program
and for the final gather. One process per GPU (torchrun-style environment, `dif.parallel.launch.RankEnv`);
rank 0 makes the NCCL unique id and hands it to the others over TCP near MASTER_ADDR:MASTER_PORT, so the same
code runs across nodes (NCCL then uses the network: IB or sockets, as NCCL_* variables choose).

Arrays are sent as bytes (ncclUint8), so every dtype (bf16, fp8 ...) travels unchanged. The all-to-all is
grouped point-to-point (ncclSend/ncclRecv to every peer inside ncclGroupStart/End) on the current stream.
Today the runner hands host arrays across segments, so each collective copies in and out of the device; an
all-to-all captured inside the denoiser's CUDA graph needs the CUDA executor to lower the op (not done).
Not run on a multi-GPU machine yet: only single-GPU machines were lent when it was written.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from dif.errors import BackendUnavailableError, DifError

RENDEZVOUS_TIMEOUT_S = 120.0


def _nccl() -> Any:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # cupy missing, or built without NCCL
        raise BackendUnavailableError(
            f"NCCL collectives need cupy with NCCL: {type(exc).__name__}: {exc}",
            hint="pip install cupy-cuda12x (NCCL comes with its wheels) on the GPU machine",
        ) from None
    return nccl


def split_parts(x: np.ndarray, ranks: int, axis: int) -> list[np.ndarray]:
    """x cut into `ranks` equal contiguous parts along `axis` (what rank j is sent); `DifError` when the
    axis does not divide."""
    if x.shape[axis] % ranks:
        raise DifError(f"all_to_all: axis {axis} of shape {x.shape} does not split into {ranks} parts")
    return [np.ascontiguousarray(p) for p in np.split(x, ranks, axis=axis)]


def rendezvous(rank: int, world: int, addr: str, port: int, make_id: Any) -> tuple[int, ...]:
    """Rank 0 calls `make_id()` (cupy's unique id: a tuple of ints, signed) and serves it to the `world - 1`
    others, met through `dif.parallel.rendezvous.meet` near addr:port; every rank returns the same tuple."""
    from dif.parallel.launch import RankEnv
    from dif.parallel.rendezvous import meet, read_exact

    peers = meet(RankEnv(rank, world, rank, addr, port), timeout_s=RENDEZVOUS_TIMEOUT_S)
    try:
        if rank == 0:
            uid = tuple(int(v) for v in make_id())
            data = json.dumps(uid).encode()
            for peer in peers:
                peer.sendall(len(data).to_bytes(4, "big") + data)
            return uid
        length = int.from_bytes(read_exact(peers[0], 4, rank), "big")
        return tuple(json.loads(read_exact(peers[0], length, rank)))
    finally:
        for peer in peers:
            peer.close()


class NcclCommunicator:
    """One rank of a NCCL communicator over all `world` ranks, on CUDA device `device`."""

    def __init__(self, rank: int, world: int, *, device: int, master_addr: str, master_port: int) -> None:
        import cupy

        nccl = _nccl()
        self.rank, self.world, self.device = rank, world, device
        cupy.cuda.Device(device).use()
        uid = rendezvous(rank, world, master_addr, master_port, nccl.get_unique_id)
        self.comm = nccl.NcclCommunicator(world, uid, rank)
        self._nccl, self._cupy = nccl, cupy

    @classmethod
    def from_env(cls) -> NcclCommunicator:
        from dif.parallel.launch import RankEnv

        env = RankEnv.from_env()
        return cls(env.rank, env.world, device=env.local_rank, master_addr=env.master_addr, master_port=env.master_port)

    def all_to_all(self, x: np.ndarray, *, split_axis: int, concat_axis: int) -> np.ndarray:
        """Part j of x (along split_axis) to rank j; what ranks 0..P-1 send joined along concat_axis."""
        cp, nccl = self._cupy, self._nccl
        parts = [cp.asarray(p) for p in split_parts(x, self.world, split_axis)]
        received = [cp.empty_like(parts[0]) for _ in range(self.world)]
        stream = cp.cuda.get_current_stream().ptr
        nccl.groupStart()
        for peer in range(self.world):
            self.comm.send(parts[peer].data.ptr, parts[peer].nbytes, nccl.NCCL_UINT8, peer, stream)
            self.comm.recv(received[peer].data.ptr, received[peer].nbytes, nccl.NCCL_UINT8, peer, stream)
        nccl.groupEnd()
        return cp.asnumpy(cp.concatenate(received, axis=concat_axis))

    def all_gather(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's x (equal shapes), in rank order."""
        cp, nccl = self._cupy, self._nccl
        src = cp.asarray(np.ascontiguousarray(x))
        dst = cp.empty((self.world, *src.shape), src.dtype)
        self.comm.allGather(src.data.ptr, dst.data.ptr, src.nbytes, nccl.NCCL_UINT8, cp.cuda.get_current_stream().ptr)
        host = cp.asnumpy(dst)
        return [host[r] for r in range(self.world)]

    def close(self) -> None:
        self.comm.destroy()
