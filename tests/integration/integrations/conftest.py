"""A real node for the adapter integration tests: the busybox corpus of `adapters_fixtures`
published to an OCI layout store, a `NodeService` and its HTTP API on a loopback port.

`adapter_node` (session): `.url`, `.token`, `.service`, `.root`. Stopped even when a test fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components import need, require_tool
from adapters_fixtures import BUSYBOX, TOKEN, build_trees


@dataclass
class AdapterNode:
    url: str
    token: str
    service: Any
    root: Path


@pytest.fixture(scope="session")
def adapter_node(tmp_path_factory: pytest.TempPathFactory):
    require_tool("runc", "fusermount3")
    need(BUSYBOX.exists(), f"busybox-static ({BUSYBOX})")
    from rollstack.node.api import create_app
    from rollstack.node.config import NodeConfig
    from rollstack.node.server import BackgroundServer
    from rollstack.node.service import NodeService
    from rollstack.plan.groups import publish_group
    from rollstack.store import open_store

    work = tmp_path_factory.mktemp("adapters")
    trees = build_trees(work / "build")
    spec = f"oci:{work / 'store'}"
    store = open_store(spec)
    try:
        publish_group(store, "os/busybox:1", [trees["os"]], work_dir=work / "build")
        publish_group(store, "repo/app:1", [trees["repo"]], work_dir=work / "build")
    finally:
        getattr(store, "close", lambda: None)()
    root = work / "node"
    service = NodeService(NodeConfig(root=root, store=spec, max_environments=8, reap_interval=0.5))
    service.start()
    try:
        with BackgroundServer(create_app(service, TOKEN)) as server:
            yield AdapterNode(server.url, TOKEN, service, root)
    finally:
        service.stop()


