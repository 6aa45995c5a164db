"""The pool's live view (reservations, dead nodes, instance changes) against real HTTP servers
standing in for node agents' `GET /v1/node`, and the typed `node_lost` error."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollstack.cluster.directory import Directory
from rollstack.cluster.placement import PlacementRequest
from rollstack.errors import NodeLost, NodeUnavailable, from_dict


class FakeNode:
    def __init__(self, instance: str = "i1", slots: int = 4) -> None:
        self.doc = {"instance": instance, "environments": 0, "env_ids": [], "status": "ok",
                    "capacity": {"cpu": 4.0, "memory": 4 << 30, "slots": slots},
                    "free": {"cpu": 4.0, "memory": 4 << 30, "slots": slots}, "hot_layers": ["sha256:a"],
                    "groups": {"k": 1}}
        node = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                import json

                if self.headers.get("authorization") != "Bearer t":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps(node.doc).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def nodes():
    ns = [FakeNode("a1"), FakeNode("b1")]
    yield ns
    for n in ns:
        try:
            n.stop()
        except OSError:
            pass


def _directory(ns) -> Directory:
    members = [{"node_id": f"n{i}", "url": n.url, "token": "t", "state": "running"} for i, n in enumerate(ns)]
    return Directory(lambda: members, interval=0.2, probe_timeout=0.5)


def test_views_subtract_creates_in_flight(nodes) -> None:
    d = _directory(nodes)
    try:
        req = PlacementRequest(layers=(("sha256:b", 10),), trace_key="k", cpu=1.0, memory=1 << 30)
        d.reserve("n0", req)
        d.reserve("n0", req)
        v = {x.node_id: x for x in d.views()}
        assert v["n0"].free_cpu == 2.0 and v["n0"].free_slots == 2 and v["n0"].groups["k"] == 3
        assert v["n0"].hot_layers == frozenset({"sha256:a", "sha256:b"}) and v["n1"].free_slots == 4
        d.release("n0", req)
        assert {x.node_id: x for x in d.views()}["n0"].free_slots == 3
    finally:
        d.close()


def test_a_dead_node_is_marked_and_a_restarted_one_is_lost_for_old_envs(nodes) -> None:
    d = _directory(nodes)
    try:
        assert all(v.alive for v in d.views())
        assert not d.lost("n0", "a1")
        nodes[0].doc["instance"] = "a2"  # the agent restarted: envs of a1 are gone
        assert d.lost("n0", "a1") and not d.lost("n0", "a2")
        nodes[1].stop()
        assert d.lost("n1", "b1")
        assert {v.node_id: v.alive for v in d.views()} == {"n0": True, "n1": False}
    finally:
        d.close()


def test_node_lost_is_typed_and_retryable() -> None:
    err = from_dict(NodeLost("node n1 lost", node="n1").to_dict())
    assert isinstance(err, NodeLost) and isinstance(err, NodeUnavailable)
    assert err.code == "node_lost" and err.retryable and err.status == 503 and err.details == {"node": "n1"}
    assert NodeUnavailable("x").retryable  # the node may be back (a restart re-adopts its envs)


def test_async_pool_stream_on_a_dead_node_is_node_lost(nodes) -> None:
    import asyncio

    from rollstack.cluster.pool import AsyncPool

    members = [{"node_id": "n0", "url": nodes[0].url, "token": "t", "state": "running"}]

    async def go():
        async with AsyncPool(nodes=members, interval=0.2) as pool:
            from rollstack.client._handles import AsyncEnvironment
            from rollstack.cluster.pool import _AsyncBound

            bound = _AsyncBound(pool._core, "n0", pool._service("n0"), "a1")
            env = AsyncEnvironment(bound, "e1")
            nodes[0].stop()  # the node dies
            with pytest.raises(NodeLost):
                async for _ in env.exec_stream("true"):
                    pass
            with pytest.raises(NodeLost):
                await env.exec("true")

    asyncio.run(go())


def test_place_keeps_one_index_per_view_refresh(nodes) -> None:
    """Creates between two reports reuse the index (each decision committed into it, so a burst
    spreads); a changed report or a failed create rebuilds it from the reports."""
    from rollstack.cluster.placement import PlacementPolicy

    d = Directory(lambda: [{"node_id": f"n{i}", "url": n.url, "token": "t", "state": "running"}
                           for i, n in enumerate(nodes)], interval=3600, probe_timeout=0.5)  # no background poll
    try:
        policy = PlacementPolicy()
        req = PlacementRequest(layers=(("sha256:a", 10),), trace_key=None, cpu=1.0, memory=1 << 30)
        builds = d.index_builds
        got = [d.place(req, policy, frozenset(), "p") for _ in range(4)]
        assert d.index_builds == builds + 1
        assert sorted(n for n, _ in got) == ["n0", "n0", "n1", "n1"]  # committed: the burst spread
        assert all(hot == 1.0 for _, hot in got)  # sha256:a is reported hot on both
        d.poll()  # same reports: still the same index
        assert d.place(req, policy, frozenset(), "p")[0] in ("n0", "n1") and d.index_builds == builds + 1
        d.release("n0", req, created=False)  # a failed create: rebuild from the reports
        nodes[1].doc = {**nodes[1].doc, "free": {"cpu": 4.0, "memory": 4 << 30, "slots": 1}}
        d.poll()
        assert d.place(req, policy, frozenset(), "p")[0] == "n0" and d.index_builds == builds + 2
        with pytest.raises(Exception, match="insufficient|no node"):
            d.place(req, policy, frozenset({"n0", "n1"}), "p")
    finally:
        d.close()
