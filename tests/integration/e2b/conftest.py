"""A real node agent on 127.0.0.1 serving the E2B-compatible API, and the unmodified `e2b` SDK
pointed at it (`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_VOLUME_API_URL`, `E2B_API_KEY`).

`e2b_node` (session): the busybox corpus published to an OCI layout store, a plan over it
published as template `tasks/app:1` (with its mutation diff and evaluator), a `NodeService`,
its HTTP API on a loopback port. Stopped even when a test fails; the environment variables are
restored afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollstack_bench.env import BUSYBOX, HELLO_MUTATION, busybox_plan, publish_busybox_corpus

TOKEN = "e2b-test-token-0123456789"
TEMPLATE = "tasks/app:1"


@dataclass
class E2BNode:
    url: str
    token: str
    service: Any
    root: Path
    store: str
    template: str = TEMPLATE


@pytest.fixture(scope="session")
def e2b_node(tmp_path_factory: pytest.TempPathFactory):
    for tool in ("runc", "fusermount3"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not installed (make setup installs it)")
    if not Path(BUSYBOX).exists():
        pytest.fail("busybox-static not installed (make setup installs it)")
    from rollstack.node.api import create_app
    from rollstack.node.config import NodeConfig
    from rollstack.node.server import BackgroundServer
    from rollstack.node.service import NodeService
    from rollstack.plan.published import publish_plan
    from rollstack.store import open_store

    work = tmp_path_factory.mktemp("e2b")
    spec = publish_busybox_corpus(work / "store", work / "build")
    doc = busybox_plan(timeout=900)
    doc.pop("mutation_text")
    doc["mutation"] = "task.diff"
    (work / "task.diff").write_text(HELLO_MUTATION)
    (work / "plan.yaml").write_text(yaml.safe_dump(doc))
    store = open_store(spec)
    try:
        publish_plan(store, TEMPLATE, work / "plan.yaml")
    finally:
        store.close()
    root = work / "node"
    service = NodeService(NodeConfig(root=root, store=spec, max_environments=12, reap_interval=0.5))
    service.start()
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY",
                                            "E2B_DEBUG", "E2B_DOMAIN")}
    try:
        with BackgroundServer(create_app(service, TOKEN)) as server:
            os.environ.update(E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_VOLUME_API_URL=server.url,
                              E2B_API_KEY=TOKEN)
            os.environ.pop("E2B_DEBUG", None)
            yield E2BNode(server.url, TOKEN, service, root, spec)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        service.stop()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def no_server_tracebacks():
    """Every E2B test: the server logged no error (an unhandled exception in the ASGI app, a
    handler's internal error) while it ran: bad input must be answered, never crash a request."""
    handler = _Errors()
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "rollstack")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert not handler.records, [f"{r.name}: {r.getMessage()}" for r in handler.records]
