"""Where the ranks of one job meet: one TCP connection from each rank 1..P-1 to rank 0.

Rank 0 listens on the first port of MASTER_PORT .. MASTER_PORT + PORT_SPAN - 1 it can bind; the others try
those ports in turn and keep the connection whose server answers the job's greeting. A fixed port is not
enough: under torchrun MASTER_PORT + 1 (MASTER_PORT is the agent's store) can be any local socket's port,
an outgoing connection's included, and then rank 0 cannot listen there ("Address already in use").

The greeting names the job (its MASTER_PORT and world size), so a rank never joins another job's rank 0 or
a stranger's server on a neighbouring port: each side sends it, checks the other's, and drops a connection
that does not match.
"""

from __future__ import annotations

import socket
import time

from dif.errors import DifError
from dif.parallel.launch import RankEnv

PORT_SPAN = 16
"""How many consecutive ports rank 0 may listen on."""
HANDSHAKE_TIMEOUT_S = 5.0
"""How long either side waits for the other's greeting before dropping the connection."""
_MAGIC = b"dif-ranks/1 "


def _greeting(env: RankEnv) -> bytes:
    return _MAGIC + env.master_port.to_bytes(4, "big") + env.world.to_bytes(4, "big")


def read_exact(sock: socket.socket, n: int, rank: int) -> bytes:
    """Exactly `n` bytes from `sock`; `DifError` when the peer closes first (the ranks' one way to read)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 22))
        if not chunk:
            raise DifError(f"rank {rank}: a peer closed its connection (did another rank fail?)")
        buf += chunk
    return bytes(buf)


def _address(env: RankEnv) -> str:
    return "127.0.0.1" if env.master_addr == "localhost" else env.master_addr


def _listen(env: RankEnv) -> socket.socket:
    addr = _address(env)
    for port in range(env.master_port, env.master_port + PORT_SPAN):
        try:
            return socket.create_server((addr, port))
        except OSError:  # taken: the next one
            continue
    raise DifError(
        f"rank 0: no free port to listen on at {addr}:{env.master_port}..{env.master_port + PORT_SPAN - 1}",
        hint="set MASTER_PORT to a free range",
    )


def _serve(env: RankEnv, timeout_s: float) -> list[socket.socket]:
    """Rank 0: accept until every other rank has greeted; their sockets in rank order."""
    greeting = _greeting(env)
    by_rank: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout_s
    with _listen(env) as server:
        port = server.getsockname()[1]
        while len(by_rank) < env.world - 1:
            server.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                raise DifError(
                    f"rank 0: {env.world - 1 - len(by_rank)} ranks did not connect to "
                    f"{_address(env)}:{port} within {timeout_s:.0f} s"
                ) from None
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                hello = read_exact(conn, len(greeting) + 4, 0)
                rank = int.from_bytes(hello[-4:], "big")
                if hello[:-4] != greeting or not 0 < rank < env.world or rank in by_rank:
                    conn.close()
                    continue
                conn.sendall(greeting)
            except (OSError, DifError):  # a stranger that hung up or stayed silent
                conn.close()
                continue
            conn.settimeout(None)
            by_rank[rank] = conn
    return [by_rank[r] for r in range(1, env.world)]


def _join(env: RankEnv, timeout_s: float) -> socket.socket:
    """Rank > 0: the connection to this job's rank 0, retrying the span of ports until `timeout_s`."""
    greeting = _greeting(env)
    addr = _address(env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for port in range(env.master_port, env.master_port + PORT_SPAN):
            try:
                sock = socket.create_connection((addr, port), timeout=HANDSHAKE_TIMEOUT_S)
            except OSError:
                continue
            if sock.getsockname() == sock.getpeername():
                # TCP's simultaneous open: a connect to a free port of the ephemeral range can pick that
                # same port as its source and connect to itself, and would then read its own greeting back.
                sock.close()
                continue
            try:
                sock.sendall(greeting + env.rank.to_bytes(4, "big"))
                if read_exact(sock, len(greeting), env.rank) == greeting:
                    sock.settimeout(None)
                    return sock
            except (OSError, DifError):  # not this job's rank 0
                pass
            sock.close()
        time.sleep(0.05)
    raise DifError(
        f"rank {env.rank}: rank 0 did not answer at {addr}:{env.master_port}..{env.master_port + PORT_SPAN - 1} "
        f"within {timeout_s:.0f} s"
    )


def meet(env: RankEnv, *, timeout_s: float) -> list[socket.socket]:
    """Connect the ranks of `env`. Rank 0 gets the sockets of ranks 1..P-1 in rank order, every other rank
    a list of one: its socket to rank 0. `DifError` when they do not all arrive within `timeout_s`."""
    if env.world == 1:
        return []
    return _serve(env, timeout_s) if env.rank == 0 else [_join(env, timeout_s)]
