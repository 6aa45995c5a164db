"""Node throughput paths end to end (real store, lazy store, overlayfs, runc, cgroups, HTTP, SDK):
GRPO fan-out (`count`), asynchronous destroy, CPU overcommit admission, a 64-env burst through
one shared `Client`, and the runc-exec fallback behind the same API."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from node_helpers import leftovers, plan, remember, serve_node
from rollstack import Client, errors
from rollstack.node.api import create_app
from rollstack.node.config import NodeConfig
from rollstack.node.server import BackgroundServer
from rollstack.node.service import NodeService

pytestmark = pytest.mark.integration
TOKEN = "fanout-token"
SMALL = {"cpu": 0.1, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"}


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fanout-root")
    with serve_node(root, corpus, TOKEN, max_environments=80) as (service, server):
        yield service, server, root


@pytest.fixture
def client(node):
    with Client(node[1].url, token=TOKEN) as c:
        yield c


def test_count_creates_a_group_of_identical_environments(node, client: Client) -> None:
    service, _server, root = node
    envs = client.create(plan(resources=SMALL), count=4)
    try:
        assert isinstance(envs, list) and len({e.id for e in envs}) == 4
        for e in envs:
            remember(root, e.id)
            assert e.exec("cat hello.txt").stdout == "bug\n"  # each got the mutation
            assert e.created.stack_digest == envs[0].created.stack_digest
        envs[0].exec("echo mine > hello.txt")
        assert envs[1].exec("cat hello.txt").stdout == "bug\n"  # private uppers
        assert "+mine" in envs[0].diff() and "+bug" in envs[1].diff()
    finally:
        for e in envs:
            e.destroy()
    assert service.wait_destroyed(60)


def test_count_is_all_or_none(node, client: Client) -> None:
    service, _server, _root = node
    before = len(client.list())
    with pytest.raises(errors.InsufficientCapacity):
        client.create(plan(resources={"cpu": 1, "memory": "4Gi", "max_memory": "4Gi"}), count=64)
    with pytest.raises(errors.InvalidRequest):
        client.create(plan(), count=0)
    with pytest.raises(errors.GroupNotFound):  # a broken group fails as a whole, nothing left
        client.create(plan(groups=["os/busybox:1", "repo/nope:1"]), count=3)
    assert len(client.list()) == before
    assert service.metrics()["environments"] == before


def test_destroy_is_asynchronous_and_idempotent(node, client: Client) -> None:
    service, _server, root = node
    env = client.create(plan(resources=SMALL))
    remember(root, env.id)
    env.exec("sleep 300 &")
    env.destroy()
    try:  # gone for the caller at once: listed as destroying until its teardown is done
        assert env.info().state == "destroying"
    except errors.EnvironmentNotFound:
        pass
    with pytest.raises(errors.EnvironmentNotFound):
        env.exec("true")
    env.destroy()  # idempotent while the background part runs, and after
    assert service.wait_destroyed(60)
    env.destroy()
    assert not (root / "envs" / env.id).exists()


def test_64_small_environments_are_admitted_on_this_node(node, client: Client) -> None:
    """The default overcommit (8 x cores) admits 64 agent-sized environments on 2 cores; a shared
    Client creates, execs and destroys them from 64 threads at once."""
    service, _server, root = node

    def one(_: int) -> int:
        env = client.create(plan(resources=SMALL))
        remember(root, env.id)
        try:
            return env.exec("echo ok").exit_code
        finally:
            env.destroy()

    with ThreadPoolExecutor(max_workers=64) as pool:
        codes = list(pool.map(one, range(64)))
    assert codes == [0] * 64
    assert service.wait_destroyed(120)
    assert not any(leftovers(root).values()), leftovers(root)


def test_cli_count_prints_one_document_per_environment(node) -> None:
    service, server, root = node
    plan_file = root.parent / "fanout-plan.json"
    plan_file.write_text(json.dumps(plan(resources=SMALL)))
    proc = subprocess.run([sys.executable, "-m", "rollstack.cli.main", "env", "create",
                           str(plan_file), "--count", "2", "--json", "--node", server.url,
                           "--token", TOKEN], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    assert len(docs) == 2 and all(d["id"].startswith("e") for d in docs)
    for d in docs:
        remember(root, d["id"])
        service.destroy(d["id"])


def test_runc_fallback_node_serves_the_same_api(corpus: str, tmp_path: Path) -> None:
    root = tmp_path / "runc-node"
    service = NodeService(NodeConfig(root=root, store=corpus, exec_agent=False, async_destroy=False))
    service.start()
    try:
        with BackgroundServer(create_app(service, TOKEN)) as server, \
                Client(server.url, token=TOKEN) as client:
            with client.create(plan(resources=SMALL)) as env:
                remember(root, env.id)
                assert not (root / "envs" / env.id / "agent").exists()
                r = env.exec("cat hello.txt; exit 3")
                assert (r.exit_code, r.stdout) == (3, "bug\n")
    finally:
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)
    shutil.rmtree(root, ignore_errors=True)
