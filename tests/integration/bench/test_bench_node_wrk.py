"""`bench node`'s wrk load against a real node (store, lazy store, overlayfs, runc, cgroups,
the in-sandbox exec agent, HTTP): every request answered 200 and counted by the node."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from components import need, require_root, require_tool

from node_helpers import plan, publish_corpus, remember, serve_node  # noqa: E402

from rollstack import Client  # noqa: E402
from rollstack_bench import node_wrk  # noqa: E402

pytestmark = pytest.mark.integration
TOKEN = "wrk-token"


def _execs(client: Client) -> float:
    for line in client._service.metrics_text().splitlines():
        if line.startswith("rollstack_execs_total "):
            return float(line.split()[1])
    return 0.0


def _wrk(tmp_path: Path, envs: int, connections: int, token: str) -> dict[str, Any]:
    """wrk for 1 s against a fresh node with `envs` environments, sending `token`."""
    require_root()
    require_tool("runc", "fusermount3", "wrk")
    need(Path("/bin/busybox").exists(), "busybox-static (/bin/busybox)")
    spec = publish_corpus(tmp_path / "store", tmp_path / "build")
    root = tmp_path / "root"
    with serve_node(root, spec, TOKEN) as (service, server), Client(server.url, token=TOKEN) as client:
        made = client.create(plan(), count=envs)
        try:
            for e in made:
                remember(root, e.id)
            doc = node_wrk.measure(server.url, token, [e.id for e in made], connections=connections,
                                   seconds=1, node_pids=[os.getpid()], execs_counter=lambda: _execs(client))
        finally:
            for e in made:
                e.destroy()
        assert service.wait_destroyed(60)
    return doc


def test_wrk_load_is_answered_and_counted_by_the_node(tmp_path: Path) -> None:
    doc = _wrk(tmp_path, envs=2, connections=4, token=TOKEN)
    assert doc["requests"] > 10, doc
    assert doc["failures"] == 0 and doc["non_2xx"] == 0 and doc["socket_errors"] == 0, doc
    assert doc["node_execs_counted"] >= doc["requests"], doc
    assert 0 < doc["p50"] <= doc["p99"], doc


def test_a_wrong_token_shows_up_as_failures(tmp_path: Path) -> None:
    doc = _wrk(tmp_path, envs=1, connections=2, token="not-the-token")
    assert doc["requests"] > 0 and doc["non_2xx"] == doc["requests"] and doc["failures"] >= doc["requests"]
    assert doc["node_execs_counted"] == 0
