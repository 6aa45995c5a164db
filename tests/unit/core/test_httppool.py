"""rollstack.core.httppool: per-thread pools, and the keep-alive order (client < server)."""

from __future__ import annotations

import inspect
import threading

import httpx
import uvicorn

from rollstack.core import httppool
from rollstack.core.httppool import CLIENT_KEEPALIVE_S, SERVER_KEEPALIVE_S, PerThreadClient


def test_clients_drop_idle_connections_before_any_server_does():
    uvicorn_default = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default
    assert CLIENT_KEEPALIVE_S < uvicorn_default <= SERVER_KEEPALIVE_S
    assert httppool.limits().keepalive_expiry == CLIENT_KEEPALIVE_S


def test_the_sdk_client_uses_the_client_keepalive():
    from rollstack.client._base import Settings
    from rollstack.client._transports import HttpService

    service = HttpService(Settings(url="http://127.0.0.1:9", token=""))
    try:
        pool = service.http._transport._pool
        assert pool._keepalive_expiry == CLIENT_KEEPALIVE_S
    finally:
        service.close()


def test_each_thread_gets_its_own_client_and_ended_threads_are_closed():
    made: list[httpx.Client] = []

    def make(ssl_context):
        made.append(httpx.Client(verify=ssl_context))
        return made[-1]

    pool = PerThreadClient(make, "test")
    mine = pool.get()
    assert pool.get() is mine
    other: list[httpx.Client] = []
    t = threading.Thread(target=lambda: other.append(pool.get()))
    t.start()
    t.join()
    assert other[0] is not mine and pool.count() == 2
    t = threading.Thread(target=pool.get)  # a new thread's client closes the ended one's
    t.start()
    t.join()
    assert other[0].is_closed
    pool.close()
    assert mine.is_closed
