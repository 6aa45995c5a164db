"""Leases and idempotency keys in the SDK (`client.leases`, `Client(lease=...)`) and the API
routes they use, against the real API app over the fake service."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_node_service import FakeService  # noqa: E402
from test_client_sdk import PLAN, TOKEN, forwarding_transport  # noqa: E402

from rollstack import AsyncClient, Client, errors  # noqa: E402
from rollstack.client.leases import LeaseKeeper  # noqa: E402
from rollstack.node.api import create_app  # noqa: E402
from rollstack.contract.models import LeaseRenewal  # noqa: E402


@pytest.fixture
def service() -> FakeService:
    return FakeService(max_environments=8)


def _client(service: FakeService, **kw) -> Client:
    return Client("http://node", token=TOKEN, transport=forwarding_transport(create_app(service, TOKEN)), **kw)


def test_created_environments_carry_the_lease_and_are_renewed_until_destroyed(service: FakeService) -> None:
    with _client(service, lease=30, renew_interval=1000) as client:
        a, b = client.create(PLAN), client.create(PLAN)
        assert service.leases == {a.id: 30, b.id: 30}
        keeper = client._leases
        assert keeper is not None and keeper.held() == {a.id, b.id}
        keeper.renew_now()
        assert service.renewals == [sorted([a.id, b.id])]  # one request for all
        a.destroy()
        service.destroy(b.id)  # destroyed elsewhere: the node says missing, the keeper drops it
        keeper.renew_now()
        assert keeper.held() == set()
    assert keeper._stop.is_set() and not keeper._thread.is_alive()


def test_the_renewer_thread_renews_on_its_interval_and_stops_on_close(service: FakeService) -> None:
    client = _client(service, lease=30, renew_interval=0.05)
    env = client.create(PLAN)
    deadline = time.monotonic() + 30
    while len(service.renewals) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(service.renewals) >= 2 and service.renewals[-1] == [env.id]
    client.close()
    n = len(service.renewals)
    time.sleep(0.2)
    assert len(service.renewals) == n


def test_without_a_lease_nothing_is_renewed(service: FakeService) -> None:
    with _client(service, lease=None) as client:
        env = client.create(PLAN)
        assert service.create_options == [{}] and client._leases is None
        env.destroy()


def test_a_node_without_the_bulk_route_is_renewed_one_by_one() -> None:
    class OldNode:
        def __init__(self) -> None:
            self.one: list[str] = []

        def renew(self, ids):
            raise errors.NotFound("Not Found")  # the route's own 404

        def renew_one(self, env_id):
            self.one.append(env_id)
            if env_id == "gone":
                raise errors.EnvironmentNotFound("no such environment")
            return LeaseRenewal(renewed=[env_id])

    keeper = LeaseKeeper(30)
    node = OldNode()
    keeper._add(node, ["a", "gone"])
    keeper.renew_now()
    assert node.one == ["a", "gone"] and keeper.held() == {"a"}


def test_renewal_errors_keep_the_lease_held() -> None:
    class Down:
        def renew(self, ids):
            raise errors.NodeUnavailable("down")

    keeper = LeaseKeeper(30)
    keeper._add(Down(), ["a"])
    keeper.renew_now()
    assert keeper.held() == {"a"}


def test_idempotency_key_reaches_the_service_as_the_header(service: FakeService) -> None:
    with _client(service, lease=None) as client:
        first = client.create(PLAN, idempotency_key="retry-1")
        again = client.create(PLAN, idempotency_key="retry-1")
        assert first.id == again.id and len(service.envs) == 1
        assert service.create_options[0] == {"idempotency_key": "retry-1"}


def test_lease_routes(service: FakeService) -> None:
    http = TestClient(create_app(service, TOKEN))
    h = {"Authorization": f"Bearer {TOKEN}"}
    env_id = http.post("/v1/environments", json={"plan": PLAN, "lease": 5}, headers=h).json()["id"]
    assert service.leases[env_id] == 5
    r = http.post("/v1/leases", json={"ids": [env_id, "nope"]}, headers=h)
    assert r.status_code == 200 and r.json() == {"renewed": [env_id], "missing": ["nope"]}
    assert http.post(f"/v1/environments/{env_id}/lease", headers=h).json()["renewed"] == [env_id]
    r = http.post("/v1/environments/nope/lease", json={"lease": 3}, headers=h)
    assert r.status_code == 404 and r.json()["error"]["code"] == "environment_not_found"
    r = http.post("/v1/environments", json={"plan": PLAN, "lease": -1}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    paths = http.get("/openapi.json", headers=h).json()["paths"]
    assert "/v1/leases" in paths and "/v1/environments/{env_id}/lease" in paths
    params = paths["/v1/environments"]["post"].get("parameters", [])
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in params)


def test_async_client_renews_on_a_task_and_cancels_it_on_close(service: FakeService) -> None:
    app = create_app(service, TOKEN)

    async def main() -> None:
        client = AsyncClient("http://node", token=TOKEN, transport=httpx.ASGITransport(app=app),
                             lease=30, renew_interval=0.05)
        env = await client.create(PLAN, idempotency_key="k-async")
        assert service.create_options[-1] == {"lease": 30.0, "idempotency_key": "k-async"}
        with anyio.fail_after(30):
            while not service.renewals:
                await anyio.sleep(0.02)
        assert service.renewals[-1] == [env.id]
        task = client._leases._task
        await client.aclose()
        assert task is not None and task.done()

    anyio.run(main)


class _Svc:
    """A node whose renew answers as scripted (the keeper only calls renew/renew_one)."""

    def __init__(self, answers: list) -> None:
        self.answers, self.calls, self.one = answers, 0, []

    def renew(self, ids, lease=None):
        self.calls += 1
        a = self.answers.pop(0) if self.answers else LeaseRenewal(renewed=list(ids))
        if isinstance(a, BaseException):
            raise a
        return a

    def renew_one(self, env_id, lease=None):
        self.one.append(env_id)
        return LeaseRenewal(renewed=[env_id])


def test_the_renewer_survives_an_answer_it_cannot_read_and_restarts_if_it_died() -> None:
    keeper = LeaseKeeper(30, interval=1000)
    svc = _Svc([KeyError("a malformed answer"), LeaseRenewal(renewed=["e1"])])
    try:
        keeper.hold(svc, ["e1"])
        keeper.renew_now()  # any failure is logged and retried next round, never fatal
        keeper.renew_now()
        assert svc.calls == 2 and keeper.held() == {"e1"}
        first = keeper._thread
        keeper._thread = type("Dead", (), {"is_alive": lambda self: False})()  # as if it had died
        keeper.hold(svc, ["e2"])
        assert keeper._thread is not first and keeper._thread.is_alive()
    finally:
        keeper.close()


def test_a_404_without_our_error_body_means_the_route_is_missing() -> None:
    """A gateway or an older node answers its framework's 404: renew one by one instead."""
    plain = errors.RollstackError("HTTP 404: Not Found")
    plain.status = 404
    keeper = LeaseKeeper(30, interval=1000)
    svc = _Svc([plain])
    try:
        keeper.hold(svc, ["e1", "e2"])
        keeper.renew_now()
        assert svc.one == ["e1", "e2"]
    finally:
        keeper.close()
