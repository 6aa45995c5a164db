"""The SDK (`Client`, `AsyncClient`) against the real API app over a fake service, in memory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from fake_node_service import FakeService  # noqa: E402

from rollstack import AsyncClient, Client, errors  # noqa: E402
from rollstack.client._base import plan_to_wire  # noqa: E402
from rollstack.node.api import create_app  # noqa: E402

TOKEN = "tok"
PLAN = {"name": "t", "groups": ["os/base:1"]}


def forwarding_transport(app) -> httpx.MockTransport:
    """A sync transport that hands every request to the ASGI app (through Starlette's TestClient)."""
    tc = TestClient(app)

    def handle(request: httpx.Request) -> httpx.Response:
        r = tc.request(request.method, str(request.url), content=request.read(), headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def service() -> FakeService:
    return FakeService(max_environments=2)


@pytest.fixture
def client(service: FakeService):
    with Client("http://node", token=TOKEN, transport=forwarding_transport(create_app(service, TOKEN))) as c:
        yield c


def test_lifecycle(client: Client, service: FakeService) -> None:
    with client.create(PLAN) as env:
        assert env.created is not None and env.created.id == env.id
        r = env.exec("echo hi", timeout=5, cwd="/w", env={"A": "1"}, stdin=b"x")
        assert (r.exit_code, r.stdout, r.timed_out) == (0, "/bin/sh -c echo hi\nx", False)
        assert service.last_exec is not None and service.last_exec.env == {"A": "1"}
        assert env.exec(["fail"]).exit_code == 3
        env.write_file("/w/a.txt", "hello")
        assert env.read_file("/w/a.txt") == b"hello"
        assert "+++ b/w/a.txt" in env.diff()
        assert env.evaluate().reward == 1.0
        assert env.stats().history[0].cpu_limit == 0.5
        assert [e.id for e in client.list()] == [env.id]
    assert client.list() == []  # the context manager destroyed it


def test_context_manager_destroys_on_error(client: Client) -> None:
    with pytest.raises(RuntimeError):
        with client.create(PLAN):
            raise RuntimeError("agent crashed")
    assert client.list() == []


def test_stream(client: Client) -> None:
    with client.create(PLAN) as env:
        chunks = list(env.exec_stream(["a", "b"]))
    assert [c.type for c in chunks] == ["stdout", "stdout", "stderr", "result"]
    assert chunks[-1].result is not None and chunks[-1].result.exit_code == 7


def test_stream_error_line_raises_typed(client: Client) -> None:
    with client.create(PLAN) as env:
        with pytest.raises(errors.PlanInvalid, match="boom"):
            list(env.exec_stream(["explode"]))


def test_typed_errors(client: Client) -> None:
    with pytest.raises(errors.EnvironmentNotFound):
        client.get("nope")
    with pytest.raises(errors.PlanInvalid):
        client.create({"name": "x"})
    client.create(PLAN), client.create(PLAN)
    with pytest.raises(errors.InsufficientCapacity) as info:
        client.create(PLAN)
    assert info.value.code == "insufficient_capacity"
    env = client.list()[0]
    with pytest.raises(errors.UnsafePath):
        client.get(env.id).read_file("/../../etc/shadow")


def test_wrong_token_is_unauthorized(service: FakeService) -> None:
    app = create_app(service, TOKEN)
    with Client("http://node", token="bad", transport=forwarding_transport(app)) as c:
        with pytest.raises(errors.Unauthorized):
            c.list()


def test_connection_refused_is_node_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with Client("http://node", token="t", transport=httpx.MockTransport(refuse)) as c:
        with pytest.raises(errors.NodeUnavailable):
            c.list()


def test_real_refused_port_is_node_unavailable() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with Client(f"http://127.0.0.1:{port}", token="t") as c:
        with pytest.raises(errors.NodeUnavailable):
            c.health()


def test_non_json_error_still_raises() -> None:
    transport = httpx.MockTransport(lambda req: httpx.Response(502, text="bad gateway"))
    with Client("http://node", token="t", transport=transport) as c:
        with pytest.raises(errors.RollstackError, match="HTTP 502"):
            c.list()


def test_unknown_code_keeps_the_code() -> None:
    body = {"error": {"code": "brand_new", "message": "from the future"}}
    transport = httpx.MockTransport(lambda req: httpx.Response(418, json=body))
    with Client("http://node", token="t", transport=transport) as c:
        with pytest.raises(errors.RollstackError) as info:
            c.list()
    assert info.value.code == "brand_new"


def test_plan_file_inlines_its_mutation(tmp_path: Path) -> None:
    (tmp_path / "fix.diff").write_text("--- a/x\n+++ b/x\n")
    (tmp_path / "plan.yaml").write_text("name: p\ngroups: [os/base:1]\nmutation: fix.diff\n")
    wire = plan_to_wire(tmp_path / "plan.yaml")
    assert wire["mutation_text"] == "--- a/x\n+++ b/x\n" and "mutation" not in wire
    with pytest.raises(errors.PlanInvalid):
        plan_to_wire(tmp_path / "missing.yaml")


def test_async_client_lifecycle(service: FakeService) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=create_app(service, TOKEN))
        async with AsyncClient("http://node", token=TOKEN, transport=transport) as client:
            async with await client.create(PLAN) as env:
                r = await env.exec(["x"])
                assert r.stdout == "x\n"
                await env.write_file("/f", b"1")
                assert await env.read_file("/f") == b"1"
                assert (await env.evaluate()).reward == 1.0
                chunks = [c async for c in env.exec_stream(["a"])]
                assert chunks[-1].type == "result"
                assert len(await client.list()) == 1
            assert await client.list() == []
            with pytest.raises(errors.EnvironmentNotFound):
                await client.get("nope")

    anyio.run(main)


def test_async_client_destroys_by_id_and_reads_metrics_like_the_sync_one(service: FakeService) -> None:
    app = create_app(service, TOKEN)
    with Client("http://node", token=TOKEN, transport=forwarding_transport(app)) as sync_client:
        sync_metrics = sync_client.metrics()
    assert sync_metrics == {k: float(v) for k, v in service.metrics().items()} and sync_metrics

    async def main() -> None:
        async with AsyncClient("http://node", token=TOKEN, transport=httpx.ASGITransport(app=app)) as client:
            env = await client.create(PLAN)
            assert [e.id for e in await client.list()] == [env.id]
            await client.destroy(env.id)
            assert await client.list() == []
            assert await client.metrics() == sync_metrics
            assert (await client.health()).status == "ok"

    anyio.run(main)


def test_metrics_text_parsing_keeps_the_nodes_gauges_only() -> None:
    from rollstack.client.routes import parse_metrics

    text = ("# HELP rollstack_created_total created total\n# TYPE rollstack_created_total gauge\n"
            "rollstack_created_total 3.0\nrollstack_environments 1\n"
            'rollstack_api_seconds_bucket{le="0.005",op="create"} 2.0\nprocess_cpu_seconds 1.5\n'
            "rollstack_bad nan-ish\n")
    assert parse_metrics(text) == {"created_total": 3.0, "environments": 1.0}


def test_an_exec_the_node_never_answers_is_exec_timeout_and_other_calls_node_unavailable() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    with Client("http://node", token=TOKEN, transport=httpx.MockTransport(handle)) as client:
        service = client._service
        from rollstack.client._base import exec_request

        with pytest.raises(errors.ExecTimeout, match="5.0 s timeout") as caught:
            service.exec("e1", exec_request("sleep 100", timeout=5.0))
        assert isinstance(caught.value, TimeoutError)
        with pytest.raises(errors.ExecTimeout):
            list(service.exec_stream("e1", exec_request("sleep 100", timeout=5.0)))
        with pytest.raises(errors.NodeUnavailable):
            service.info("e1")

    async def main() -> None:
        async def ahandle(request: httpx.Request) -> httpx.Response:
            raise httpx.ReadTimeout("no answer", request=request)

        async with AsyncClient("http://node", token=TOKEN, transport=httpx.MockTransport(ahandle)) as client:
            with pytest.raises(errors.ExecTimeout):
                await (await _env(client)).exec("sleep 100", timeout=5.0)

    async def _env(client: AsyncClient):
        from rollstack.client._handles import AsyncEnvironment

        return AsyncEnvironment(client._service, "e1")

    anyio.run(main)


def test_async_create_with_count_is_one_call_all_or_none(service: FakeService) -> None:
    app = create_app(service, TOKEN)
    posts: list[dict] = []

    class Recording(httpx.ASGITransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST" and request.url.path == "/v1/environments":
                posts.append(json.loads(request.content))
            return await super().handle_async_request(request)

    async def main() -> None:
        async with AsyncClient("http://node", token=TOKEN, transport=Recording(app=app)) as client:
            group = await client.create(PLAN, count=2)
            assert isinstance(group, list) and len(group) == 2
            assert len({e.id for e in group}) == 2 and all(e.created is not None for e in group)
            assert posts == [{"plan": plan_to_wire(PLAN), "count": 2, "lease": 60.0}]  # the client's default lease
            assert sorted(e.id for e in await client.list()) == sorted(e.id for e in group)
            with pytest.raises(errors.InsufficientCapacity):  # the node holds 2: none of 2 more
                await client.create(PLAN, count=2)
            assert len(await client.list()) == 2
            for e in group:
                await e.destroy()
            assert await client.list() == []

    anyio.run(main)


def test_fork_through_the_sdk_and_the_api(service: FakeService) -> None:
    service.max = 4
    with Client("http://node", token=TOKEN, transport=forwarding_transport(create_app(service, TOKEN)),
                lease=30) as client:
        with client.create(PLAN) as env:
            env.write_file("/w", "state")
            kids = env.fork(2)
            assert len({k.id for k in kids} | {env.id}) == 3
            assert [k.read_file("/w") for k in kids] == [b"state", b"state"]
            assert all(service.leases[k.id] == 30 for k in kids)  # the client's lease, held
            with pytest.raises(errors.InsufficientCapacity):
                env.fork(2)  # all or none: the node is full
            for k in kids:
                k.destroy()
        with pytest.raises(errors.EnvironmentNotFound):
            env.fork()  # destroyed: not found
