"""One `Client` shared by 128 threads, over real HTTP (uvicorn on loopback), in bursts separated
by idle gaps longer than the server's keep-alive timeout: the pattern that failed with
`NodeUnavailable: ... [Errno 9] Bad file descriptor` when all threads shared one httpx pool,
and with `Server disconnected without sending a response` / ECONNRESET when the client kept
idle connections as long as the server did (the keep-alive race, rollstack.core.httppool).

The test scales both keep-alives down (server 2 s, client 0.5 s: the real ones are
SERVER_KEEPALIVE_S and CLIENT_KEEPALIVE_S) so that the idle gaps outlast them in seconds."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from rollstack import Client
from rollstack.core import httppool
from rollstack.node.server import free_port

pytestmark = pytest.mark.integration

THREADS = 128
SERVER_KEEPALIVE_S = 2
CLIENT_KEEPALIVE_S = 0.5


SERVER = """
import random, sys, threading, time
sys.path.insert(0, {fake_dir!r})
import uvicorn
from fake_node_service import FakeService
from rollstack.node.api import create_app

class SlowFake(FakeService):
    # answers after a random delay, so requests overlap and connections go idle unevenly
    lock = threading.Lock()
    def create(self, plan, **options):
        time.sleep(random.random() * 0.5)
        with self.lock:
            return super().create(plan, **options)
    def destroy(self, env_id):
        with self.lock:
            return super().destroy(env_id)

uvicorn.run(create_app(SlowFake(max_environments=10_000), token=None), host="127.0.0.1",
            port={port}, log_level="warning", timeout_keep_alive={keepalive})
"""


@pytest.fixture
def node_url():
    """The real API over a fake service, served by uvicorn in its own process (its own GIL)."""
    port = free_port()
    fake_dir = str(Path(__file__).resolve().parents[2] / "unit" / "node")
    proc = subprocess.Popen([sys.executable, "-c", SERVER.format(fake_dir=fake_dir, port=port, keepalive=SERVER_KEEPALIVE_S)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_shared_client_survives_bursts_after_idle_keepalive_expiry(node_url, monkeypatch):
    monkeypatch.setattr(httppool, "CLIENT_KEEPALIVE_S", CLIENT_KEEPALIVE_S)
    errors: list[BaseException] = []
    with Client(node_url, token="") as client:
        def burst_worker() -> None:
            try:
                for _ in range(4):
                    env = client.create({"name": "t", "groups": ["os/base:1"]})
                    assert env.exec("true").exit_code == 0
                    env.destroy()
            except BaseException as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        for _ in range(3):
            threads = [threading.Thread(target=burst_worker) for _ in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            time.sleep(SERVER_KEEPALIVE_S + 0.5)  # the next burst meets connections the server closed
        # the pools of ended threads are closed when a new thread makes its own
        assert client.health().status == "ok"
        assert client._service._pool.count() == 1
        remaining = client.list()
    assert errors == [], errors[:3]
    assert remaining == []  # every create was destroyed
