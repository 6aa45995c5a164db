"""`BackgroundServer`: uvicorn serving an app on a loopback port from a thread of this process.

For tests and benchmarks that want the real HTTP stack without a daemon: `start()` returns once
the socket accepts connections; `stop()` shuts uvicorn down and joins the thread.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from rollstack.core.httppool import SERVER_KEEPALIVE_S
from rollstack.errors import NodeUnavailable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None) -> None:
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                timeout_keep_alive=SERVER_KEEPALIVE_S)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="rollstack-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise NodeUnavailable(f"test server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
