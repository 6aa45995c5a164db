"""Leases, idempotent creates and retried teardowns on a real node (runc, overlayfs, the lazy
store, cgroups) through the HTTP API and the SDK. Leases of ~2 s and a 0.5 s reaper keep it short;
every wait is on a condition with a generous deadline, never on speed."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from node_helpers import plan, remember, serve_node
from rollstack import Client, errors

pytestmark = pytest.mark.integration
TOKEN = "lease-token"
LEASE = 2.0
DEADLINE = 60.0


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("node-root")
    with serve_node(root, corpus, TOKEN, max_environments=2, reap_interval=0.5, warm_pool=0) as (service, server):
        yield service, server, root


def _client(node, **kw) -> Client:
    _service, server, _root = node
    return Client(server.url, token=TOKEN, **kw)


def _wait_gone(client: Client, env_id: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            client.get(env_id)
        except errors.EnvironmentNotFound:
            return
        time.sleep(0.2)
    pytest.fail(f"{env_id} was not reaped")


def _create(client: Client, root: Path, **kw):
    env = client.create(plan(), **kw)
    remember(root, env.id)
    return env


def test_a_lapsed_lease_is_reaped_and_its_capacity_freed(node) -> None:
    service, _server, root = node
    observer = _client(node, lease=None)
    dying = _client(node, lease=LEASE)
    envs = [_create(dying, root), _create(dying, root)]
    assert all(e.info().lease == LEASE for e in envs)
    with pytest.raises(errors.InsufficientCapacity):  # the node is full
        observer.create(plan())
    dying._leases.close()  # the client "dies": nobody renews any more
    for env in envs:
        _wait_gone(observer, env.id)
    assert observer.metrics()["lease_expired_total"] >= 2
    with _create(observer, root) as env:  # the capacity is back
        assert env.exec("true").exit_code == 0
        assert env.info().lease is None  # no lease: only its lifetime
    dying.close()
    observer.close()


def test_the_sdk_renews_while_it_holds_and_stops_on_close(node) -> None:
    _service, _server, root = node
    observer = _client(node, lease=None)
    client = _client(node, lease=LEASE)  # renews every LEASE / 3
    env = _create(client, root)
    held_until = time.monotonic() + 4 * LEASE  # several leases long: only renewals keep it
    while time.monotonic() < held_until:
        assert observer.get(env.id).info().state == "running"
        time.sleep(0.25)
    assert env.exec("echo alive").stdout == "alive\n"
    client.close()  # stops renewing: the node reaps it within a lease (plus a reaper tick)
    _wait_gone(observer, env.id)
    observer.close()


def test_a_renewed_lease_is_not_reaped(node) -> None:
    _service, server, root = node
    import httpx

    with _client(node, lease=None) as client:
        env = _create(client, root)
        h = {"Authorization": f"Bearer {TOKEN}"}
        r = httpx.post(f"{server.url}/v1/environments/{env.id}/lease", json={"lease": LEASE}, headers=h)
        assert r.status_code == 200 and r.json()["renewed"] == [env.id]
        until = time.monotonic() + 3 * LEASE
        while time.monotonic() < until:
            r = httpx.post(f"{server.url}/v1/leases", json={"ids": [env.id, "e000000000000"]}, headers=h)
            assert r.json() == {"renewed": [env.id], "missing": ["e000000000000"]}
            time.sleep(LEASE / 4)
        assert env.info().state == "running"
        env.destroy()


def test_an_idempotent_retry_returns_the_same_environment(node) -> None:
    service, _server, root = node
    with _client(node, lease=None) as client:
        first = _create(client, root, idempotency_key="retry-key-1")
        again = client.create(plan(), idempotency_key="retry-key-1")
        assert again.id == first.id and service.live_count() == 1
        with pytest.raises(errors.IdempotencyConflict):
            client.create(plan(timeout=99), idempotency_key="retry-key-1")
        first.destroy()
        _wait_gone(client, first.id)

        # two concurrent retries of one key: one environment, both get its id
        with ThreadPoolExecutor(2) as pool:
            ids = list(pool.map(lambda _: client.create(plan(), idempotency_key="retry-key-2").id, range(2)))
        remember(root, ids[0])
        assert ids[0] == ids[1] and service.live_count() == 1
        client.destroy(ids[0])
        _wait_gone(client, ids[0])


def test_a_failed_teardown_stays_destroying_and_is_retried_until_clean(node, monkeypatch) -> None:
    service, _server, root = node
    release = threading.Event()
    attempts = []
    real = service.stages.teardown

    def flaky(rec):
        attempts.append(rec.id)
        if not release.is_set():
            raise errors.RuntimeFailure("injected: the mount is busy")
        return real(rec)

    monkeypatch.setattr(service.stages, "teardown", flaky)
    with _client(node, lease=None) as client:
        env = _create(client, root)
        env.destroy()
        deadline = time.monotonic() + DEADLINE
        while len(attempts) < 2 and time.monotonic() < deadline:  # the first try and a retry failed
            time.sleep(0.1)
        assert len(attempts) >= 2
        info = client.get(env.id).info()
        assert info.state == "destroying"  # never gone while its resources remain
        assert [e.state for e in client.list() if e.id == env.id] == ["destroying"]
        events = [e["type"] for e in env.stats().events]
        assert "destroy_failed" in events
        assert (root / "node-envs" / f"{env.id}.json").exists()  # a restart would finish it
        with pytest.raises(errors.EnvironmentNotFound):
            env.exec("true")
        release.set()
        _wait_gone(client, env.id)
        assert not (root / "node-envs" / f"{env.id}.json").exists()
        assert service.metrics()["destroy_failures_total"] >= 2
