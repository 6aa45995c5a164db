"""`PerThreadClient`: one `httpx.Client` per thread behind one object, safe to share.

A single httpx/httpcore connection pool used by many threads at once failed under bursts with
`ReadError: [Errno 9] Bad file descriptor`: when a burst meets keep-alive connections the server
closed while they were idle, the pool closes such a connection in one thread while another
thread is reading from it (reproduced by tests/integration/client/test_client_threads.py).
Pools that are never shared between threads share no sockets. A thread's pool is made on its
first request (all share one TLS context: making one per pool costs ~20 ms of CPU); the pools
of threads that ended are closed when another thread makes its own, and all on `close()`.

Keep-alive: a client must drop an idle connection before the server does. When both wait the
same time (httpx and uvicorn: 5 s each), a request sent at the moment the server closes the
connection is lost (`Server disconnected without sending a response`, ECONNRESET; seen in CI
under load). So rollstack's servers keep idle connections `SERVER_KEEPALIVE_S` and its clients
`CLIENT_KEEPALIVE_S`, well under that and under uvicorn's default.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import httpx

from rollstack.errors import NodeUnavailable

SERVER_KEEPALIVE_S = 75
"""Seconds rollstack's HTTP servers (node agent, gateway) keep an idle connection open."""
CLIENT_KEEPALIVE_S = 4.0
"""Seconds rollstack's HTTP clients keep an idle pooled connection (< any server's keep-alive)."""


def limits() -> httpx.Limits:
    """httpx's default pool limits (100 connections, 20 kept alive) with the client keep-alive
    (the module docstring says why)."""
    return httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=CLIENT_KEEPALIVE_S)


class PerThreadClient:
    def __init__(self, make: Callable[[Any], httpx.Client], what: str) -> None:
        """`make(ssl_context)` builds one thread's client; `what` names the peer in errors."""
        self._make, self._what = make, what
        self._local = threading.local()
        self._lock = threading.Lock()
        self._clients: list[tuple[threading.Thread, httpx.Client]] = []
        self._ssl: Any = None
        self.closed = False

    def get(self) -> httpx.Client:
        """This thread's client."""
        client = getattr(self._local, "client", None)
        if client is not None and not client.is_closed:
            return client
        with self._lock:
            if self.closed:
                raise NodeUnavailable(f"client for {self._what} is closed")
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            ssl_context = self._ssl
        client = self._make(ssl_context)
        with self._lock:
            dead = [c for t, c in self._clients if not t.is_alive()]
            self._clients = [(t, c) for t, c in self._clients if t.is_alive()]
            if self.closed:
                dead.append(client)
            else:
                self._clients.append((threading.current_thread(), client))
        for old in dead:
            old.close()
        if self.closed:
            raise NodeUnavailable(f"client for {self._what} is closed")
        self._local.client = client
        return client

    def count(self) -> int:
        with self._lock:
            return len(self._clients)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            clients, self._clients = [c for _, c in self._clients], []
        for client in clients:
            client.close()
