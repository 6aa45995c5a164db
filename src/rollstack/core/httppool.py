"""`PerThreadClient`: one `httpx.Client` per thread behind one object, safe to share.

A single httpx/httpcore connection pool used by many threads at once failed under bursts with
`ReadError: [Errno 9] Bad file descriptor`: when a burst meets keep-alive connections the server
closed while they were idle, the pool closes such a connection in one thread while another
thread is reading from it (reproduced by tests/integration/client/test_client_threads.py).
Pools that are never shared between threads share no sockets. A thread's pool is made on its
first request (all share one TLS context: making one per pool costs ~20 ms of CPU); the pools
of threads that ended are closed when another thread makes its own, and all on `close()`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import httpx

from rollstack.errors import NodeUnavailable


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
