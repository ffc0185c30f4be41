"""Running the `dif serve` app with uvicorn: in the foreground (the command) or on a thread (tests, perf).

The socket is bound here, before uvicorn starts, so port 0 gives a free port whose number is known.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from dif.errors import UsageError


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}", hint="pick another --port") from None
    sock.listen(2048)
    return sock


def make_server(app: Any, sock: socket.socket) -> uvicorn.Server:
    # one event loop, no reload, no access log: the worker thread does the work, uvicorn only waits on it
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", backlog=2048)
    server = uvicorn.Server(config)
    return server


class ServerThread:
    """uvicorn on a background thread; `url` once `start()` returns, `stop()` ends it."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = make_server(app, self.sock)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise UsageError(f"the server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self.sock.close()
