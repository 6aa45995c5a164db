"""The cluster layer on a real 3-node Ray cluster (ray.cluster_utils: a real GCS and three
raylets on this host, each node with the `rollstack` resource, each node agent in its own
network namespace behind its own shaped link), one per module: node agents as
Ray actors (up/status/down, CLI too), the Pool (placement, direct calls), the gateway (and its
restart), peer chunks, node loss (SIGKILL: node_lost, rejoin), an agent that cannot start, and
nothing left behind after `down`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollstack_bench.env import busybox_plan, publish_busybox_corpus
from rollstack.errors import ClusterUnavailable, NodeLost, NodeUnavailable

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "rollstack.cli.main"]


def _cgroups(ids: set[str]) -> list[str]:
    out = []
    for hier in Path("/sys/fs/cgroup").iterdir():
        parent = hier / "rollstack"
        if parent.is_dir():
            out += [str(p) for p in parent.iterdir() if p.name in ids]
    return out


def _mounts(prefix: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(prefix))]


def _agent_procs(root: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if str(root).encode() in cmd and (b"rollstack.node.agent" in cmd or b"rollstack.lazystore.daemon" in cmd):
                out.append(int(p.name))
    return out


class Rig:
    def __init__(self, address: str, spec: str, root: Path, cluster) -> None:
        self.address, self.spec, self.root, self.cluster = address, spec, root, cluster
        self.env_ids: set[str] = set()
        self.nodes = 3
        self.fabric = None  # rollstack_bench.cluster_net.Fabric: the nodes' network namespaces


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory):
    import ray
    from ray.cluster_utils import Cluster

    import rollstack.cluster as rc

    from rollstack_bench.cluster_net import Fabric

    work = tmp_path_factory.mktemp("cluster")
    spec = publish_busybox_corpus(work / "store", work / "build")
    # each node agent (and its lazy store: the peer server) in its own network namespace behind
    # its own shaped link, as `bench cluster` runs them (the raylet's env tells its actor where)
    fabric = Fabric(3, "dc").__enter__()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"rollstack": 1},
                                                            "include_dashboard": False,
                                                            "env_vars": fabric.nodes[0].env})
    try:
        for i in range(2):
            cluster.add_node(num_cpus=1, resources={"rollstack": 1}, env_vars=fabric.nodes[i + 1].env)
        cluster.wait_for_nodes()
        root = work / "nodes"
        # an agent that cannot start: every node reports it, none is left running
        with pytest.raises(NodeUnavailable) as bad:
            rc.up(cluster.address, spec, root=work / "bad", options={"max_environments": 0}, start_timeout=20)
        assert "3 of 3 node agents failed to start" in str(bad.value) and "max_environments" in str(bad.value)
        assert not _agent_procs(work / "bad")
        doc = rc.up(cluster.address, spec, root=root, options={"max_environments": 16})
        assert len(doc["nodes"]) == 3 and doc["failed"] == []
        rig = Rig(cluster.address, spec, root, cluster)
        rig.fabric = fabric
        yield rig
        down = rc.down(cluster.address)
        assert len([s for s in down["stopped"] if s["stopped"]]) == rig.nodes, down
        # nothing left: no process, mount, cgroup or directory of any node
        assert not _agent_procs(root)
        assert _mounts(root) == []
        assert _cgroups(rig.env_ids) == []
        assert not root.exists() or list(root.iterdir()) == []
    finally:
        ray.shutdown()
        cluster.shutdown()
        fabric.close()


def _pool(rig: Rig):
    from rollstack import Pool

    return Pool(rig.address, interval=0.5)


def test_status_cli_and_direct_calls(rig: Rig) -> None:
    env = os.environ | {"RAY_ADDRESS": rig.address}
    proc = subprocess.run(CLI + ["cluster", "status", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    nodes = json.loads(proc.stdout)["nodes"]
    assert len(nodes) == 3 and len({n["url"] for n in nodes}) == 3
    assert {"node_id", "url", "environments", "capacity", "hot_stacks"} <= set(nodes[0])
    assert all(n["capacity"]["slots"] == 16 for n in nodes)
    assert len({Path(n["url"]).name for n in nodes}) == 3  # one address each, one host
    assert {n["url"].split("//")[1].split(":")[0] for n in nodes} == {n.ip for n in rig.fabric.nodes}  # own netns
    with _pool(rig) as pool:
        envs = pool.create(busybox_plan(), count=4)
        rig.env_ids.update(e.id for e in envs)
        try:
            for e in envs:
                m = pool.directory.member(e.node_id)
                assert e._service._http.settings.url == m.url  # noqa: SLF001 - the node itself, no hop
                assert e.exec("cat hello.txt").stdout == "bug\n"
            placed = {e.node_id for e in envs}
            time.sleep(1.2)
            report = {n.node_id: n for n in pool.nodes()}
            key = next(iter(pool.directory.members[next(iter(placed))].info["groups"]))
            assert sum(report[n].groups.get(key, 0) for n in report) == 4
            assert all(report[n].hot_layers for n in placed)
            again = pool.get(envs[0].id)
            assert again.node_id == envs[0].node_id
            assert {i.id for i in pool.list()} >= {e.id for e in envs}
        finally:
            for e in envs:
                e.destroy()


def test_gateway_serves_the_pool_and_survives_a_restart(rig: Rig) -> None:
    from rollstack import Client
    from rollstack.cluster.gateway import create_gateway
    from rollstack.node.server import BackgroundServer

    with _pool(rig) as pool:
        token = next(iter(pool.directory.members.values())).token
        with BackgroundServer(create_gateway(pool, token)) as gw:
            with Client(gw.url, token=token) as c:
                env = c.create(busybox_plan())
                rig.env_ids.add(env.id)
                assert env.exec("cat hello.txt").stdout == "bug\n"
                chunks = list(env.exec_stream("echo streamed"))
                assert chunks[-1].type == "result" and any(ch.data == "streamed\n" for ch in chunks[:-1])
                group = c.create(busybox_plan(), count=3)  # a GRPO group through the gateway
                rig.env_ids.update(e.id for e in group)
                assert len({e.id for e in group}) == 3
                assert [e.exec("cat hello.txt").stdout for e in group] == ["bug\n"] * 3
                for e in group:
                    e.destroy()
                with pytest.raises(Exception) as wrong:
                    Client(gw.url, token="wrong").list()
                assert getattr(wrong.value, "code", "") == "unauthorized"
        # a new gateway knows nothing: it rebuilds env -> node from the nodes
        with BackgroundServer(create_gateway(pool, token)) as gw2:
            with Client(gw2.url, token=token) as c:
                again = c.get(env.id)
                again.write_file("/tmp/x", b"kept")
                assert again.read_file("/tmp/x") == b"kept"
                assert env.id in {i.id for i in c.list()}
                again.destroy()
                with pytest.raises(Exception) as gone:
                    c.get(env.id)
                assert getattr(gone.value, "code", "") == "environment_not_found"


def test_gateway_serves_the_e2b_api_for_the_pool(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unmodified e2b SDK with E2B_API_URL/E2B_SANDBOX_URL at the gateway: a sandbox from a
    published template is placed on a node, its command output streams through, files go both
    ways, list/info/kill reach its node, and unknown ids get the SDK's own exceptions."""
    import yaml
    from e2b import Sandbox
    from e2b.exceptions import AuthenticationException, SandboxException

    from rollstack_bench.env import HELLO_MUTATION
    from rollstack.cluster.gateway import create_gateway
    from rollstack.node.server import BackgroundServer
    from rollstack.plan.published import publish_plan
    from rollstack.store import open_store

    work = rig.root.parent
    doc = busybox_plan(name="e2b-gw", timeout=300)
    doc.pop("mutation_text")
    doc["mutation"] = "task.diff"
    (work / "task.diff").write_text(HELLO_MUTATION)
    (work / "gw-plan.yaml").write_text(yaml.safe_dump(doc))
    store = open_store(rig.spec)
    try:
        publish_plan(store, "tasks/gw:1", work / "gw-plan.yaml")
    finally:
        store.close()
    with _pool(rig) as pool:
        token = next(iter(pool.directory.members.values())).token
        with BackgroundServer(create_gateway(pool, token)) as gw:
            monkeypatch.setenv("E2B_API_URL", gw.url)
            monkeypatch.setenv("E2B_SANDBOX_URL", gw.url)
            monkeypatch.setenv("E2B_API_KEY", token)
            monkeypatch.delenv("E2B_DEBUG", raising=False)
            box = Sandbox.create("tasks/gw:1", timeout=120)
            rig.env_ids.add(box.sandbox_id)
            try:
                pool.directory.poll()
                holders = [m.node_id for m in pool.directory.members.values()
                           if box.sandbox_id in (m.info or {}).get("env_ids", [])]
                assert len(holders) == 1  # created on one node of the pool
                seen: list[tuple[float, str]] = []
                t0 = time.monotonic()
                r = box.commands.run("cat /work/app/hello.txt; for i in 1 2; do echo line$i; sleep 0.6; done",
                                     on_stdout=lambda s: seen.append((time.monotonic() - t0, s)))
                end = time.monotonic() - t0
                assert (r.exit_code, r.stdout) == (0, "bug\nline1\nline2\n")  # the template's mutation applied
                assert seen and seen[0][0] < end - 0.5  # streamed through the gateway, not buffered
                box.files.write("/tmp/gw.txt", "through the gateway")
                assert box.files.read("/tmp/gw.txt") == "through the gateway"
                assert box.sandbox_id in {s.sandbox_id for s in Sandbox.list().next_items()}
                assert box.get_info().template_id == "tasks/gw:1"
            finally:
                assert box.kill() is True
            assert not box.is_running()
            assert Sandbox.kill(box.sandbox_id) is False  # the node answered 404
            with pytest.raises(SandboxException):
                Sandbox.create("tasks/none:1", timeout=30)
            with pytest.raises(AuthenticationException):
                Sandbox.create("tasks/gw:1", timeout=30, api_key="wrong")


def test_peers_serve_chunks_before_the_registry(rig: Rig) -> None:
    from rollstack import Client
    from rollstack.lazystore.client import LazyStoreClient

    with _pool(rig) as pool:
        members = sorted(pool.directory.members.values(), key=lambda m: m.node_id)
        a, b = members[0], members[1]

        def daemon(m):
            lazy = rig.root / m.node_id.removeprefix("rollstack-node-") / "lazy"
            return LazyStoreClient.connect(lazy / "mnt", lazy / "state")

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(daemon(b).stats()["peers"]["urls"]) < 2:
            time.sleep(0.5)
        assert len(daemon(b).stats()["peers"]["urls"]) == 2  # learnt from the cluster
        plan = busybox_plan(name="peer", fetch={"background": False})
        with Client(a.url, token=a.token) as ca, Client(b.url, token=b.token) as cb:
            ea = ca.create(plan)
            rig.env_ids.add(ea.id)
            ea.exec("cat /bin/busybox >/dev/null")
            before = daemon(b).stats()["peers"]["hits"]
            eb = cb.create(plan)
            rig.env_ids.add(eb.id)
            eb.exec("cat /bin/busybox >/dev/null")
            stats = daemon(b).stats()
            ea.destroy()
            eb.destroy()
        assert stats["peers"]["hits"] > before, stats["peers"]
        assert stats["fetch"]["transferred_bytes"].get("peer", 0) > 0, stats["fetch"]["transferred_bytes"]


def test_node_loss_is_node_lost_and_the_node_rejoins(rig: Rig) -> None:
    with _pool(rig) as pool:
        envs = pool.create(busybox_plan(name="loss"), count=6)
        rig.env_ids.update(e.id for e in envs)
        by_node: dict[str, list] = {}
        for e in envs:
            by_node.setdefault(e.node_id, []).append(e)
        victim = next(iter(by_node))
        node_root = rig.root / victim.removeprefix("rollstack-node-")
        pids = _agent_procs(node_root)
        assert pids
        old_instance = pool.directory.instance(victim)
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(NodeLost) as lost:
            by_node[victim][0].exec("true")
        detect = time.monotonic() - t0
        # well under the 60 s a call would wait without the detection (measured: 16-200 ms);
        # not a speed bound: the suite runs on a busy machine
        assert detect < 30.0 and lost.value.retryable and lost.value.code == "node_lost"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(v.alive for v in pool.nodes() if v.node_id == victim) and \
                pool.directory.instance(victim) == old_instance:
            time.sleep(0.1)
        assert time.monotonic() - t0 < 30.0
        for node, es in by_node.items():  # the others are undisturbed
            if node != victim:
                assert all(e.exec("cat hello.txt").stdout == "bug\n" for e in es)
        more = pool.create(busybox_plan(name="after"), count=2)
        rig.env_ids.update(e.id for e in more)
        # the node comes back (its actor restarts the agent), cleans up and takes envs again
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            v = next((v for v in pool.nodes() if v.node_id == victim), None)
            if v is not None and v.alive and pool.directory.instance(victim) != old_instance:
                break
            time.sleep(0.5)
        assert pool.directory.instance(victim) != old_instance
        for e in by_node[victim]:  # re-adopted by the new agent (its fd-holder kept the mount), or gone, typed
            try:
                assert e.exec("cat hello.txt").stdout == "bug\n"
            except NodeLost:
                assert not (node_root / "envs" / e.id).exists()
        back = pool.create(busybox_plan(name="back"), count=3)
        rig.env_ids.update(e.id for e in back)
        more += back
        for e in [*envs, *more]:
            try:
                e.destroy()
            except NodeLost:
                pass


def test_bad_addresses_and_no_rollstack_nodes(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.run(CLI + ["cluster", "up", "--address", "127.0.0.1:1", "--store", rig.spec],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("error: cluster_unavailable: no Ray cluster at 127.0.0.1:1")
    proc = subprocess.run(CLI + ["cluster", "status", "--address", "not-an-address"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "error: invalid_request:" in proc.stderr
    from rollstack.cluster import control, ray_env

    monkeypatch.setattr(ray_env, "rollstack_nodes", lambda _ray: [])
    with pytest.raises(ClusterUnavailable, match="custom resource 'rollstack'"):
        control.up(rig.address, rig.spec, root=rig.root)


GRPO_TEMPLATE = {
    "groups": ["os/busybox:1", "repo/{repo}:{version}"], "workdir": "{workdir}",
    "resources": {"cpu": 0.25, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"},
    "fetch": {"background": False}, "timeout": 300,
    "evaluator": {"groups": ["os/busybox:1", "repo/{repo}:{version}"], "command": 'eval "$RS_TEST_COMMAND"'},
}
BUG = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+bug\n"
FIX = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-bug\n+hello\n"


def test_grpo_over_async_pool_resamples_the_rollouts_of_a_killed_node(rig: Rig) -> None:
    import asyncio

    from rollstack import AsyncPool
    from rollstack.integrations.grpo import run_batch
    from rollstack.integrations.policies import ScriptedPolicy
    from rollstack.integrations.tasks import SweTask

    tasks = [SweTask(instance_id=f"app.1.hello__{i}", repo="app", version="1", workdir="/work/app", patch=BUG,
                     fix=FIX, FAIL_TO_PASS=["hello.txt::hello"], test_command="grep -qx hello hello.txt")
             for i in range(2)]
    killed: list[str] = []

    class KillOnce(ScriptedPolicy):
        async def rollout(self, env, task, rng):
            if not killed:  # the first rollout to start takes its node down (agent + daemon)
                node = env.node_id
                killed.append(node)
                for pid in _agent_procs(rig.root / node.removeprefix("rollstack-node-")):
                    os.kill(pid, signal.SIGKILL)
            return await super().rollout(env, task, rng)

    async def go():
        async with AsyncPool(rig.address, interval=0.5) as pool:
            return await run_batch(pool, tasks, 3, KillOnce(60), template=GRPO_TEMPLATE, concurrency=6)

    report, groups = asyncio.run(go())
    flat = [r for g in groups for r in g]
    assert killed and [r.status for r in flat] == ["ok"] * 6, [(r.status, r.error, r.message) for r in flat]
    assert [r.reward for r in flat] == [1.0] * 6  # nothing lost after resampling
    assert report["rollouts"]["resampled"] >= 1


def test_a_flapping_node_keeps_restarting_and_disturbs_no_one(rig: Rig) -> None:
    import rollstack.cluster as rc

    with _pool(rig) as pool:
        envs = pool.create(busybox_plan(name="flap"), count=3)
        rig.env_ids.update(e.id for e in envs)
        nodes = {e.node_id for e in envs}
        flapper = sorted(set(pool.directory.members) - nodes or set(pool.directory.members))[0]
        before = {n["node_id"]: n["restarts"] for n in rc.status(rig.address)["nodes"]}
        for _ in range(3):
            instance = pool.directory.instance(flapper)
            for pid in _agent_procs(rig.root / flapper.removeprefix("rollstack-node-")):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pool.directory.probe(flapper)
                if pool.directory.instance(flapper) not in (None, instance):
                    break
                time.sleep(0.3)
            assert pool.directory.instance(flapper) != instance
        deadline = time.monotonic() + 30  # its supervisor marks it running once its own probe answers
        while time.monotonic() < deadline:
            after = {n["node_id"]: n for n in rc.status(rig.address)["nodes"]}
            if after[flapper]["state"] == "running":
                break
            time.sleep(0.3)
        assert after[flapper]["restarts"] == before[flapper] + 3 and after[flapper]["state"] == "running"
        for e in envs:  # environments on the other nodes never noticed
            if e.node_id != flapper:
                assert e.exec("cat hello.txt").stdout == "bug\n"
        for e in envs:
            try:
                e.destroy()
            except NodeLost:
                pass


def test_removing_a_ray_node_is_node_lost_and_its_agent_stops_with_it(rig: Rig) -> None:
    """Runs last: the cluster has 2 nodes afterwards."""
    import shutil

    from rollstack import Pool
    from rollstack.cluster.ray_env import actor_name

    node = next(iter(rig.cluster.worker_nodes))
    name = actor_name(node.node_id)
    node_root = rig.root / name.removeprefix("rollstack-node-")
    with _pool(rig) as pool:
        m = pool.directory.member(name)
        with Pool(nodes=[{"node_id": name, "url": m.url, "token": m.token}], store=rig.spec) as one:
            env = one.create(busybox_plan(name="removed"))
            rig.env_ids.add(env.id)
            assert env.exec("cat hello.txt").stdout == "bug\n"
            t0 = time.monotonic()
            rig.cluster.remove_node(node, allow_graceful=False)
            rig.nodes = 2
            with pytest.raises(NodeLost):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # calls still answered until the agent notices
                    env.exec("true")
                    time.sleep(0.1)
            assert time.monotonic() - t0 < 30.0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(v.alive for v in pool.nodes() if v.node_id == name):
            time.sleep(0.2)
        assert not any(v.alive for v in pool.nodes() if v.node_id == name)
    deadline = time.monotonic() + 90  # PDEATHSIG: the agent stops with its actor, and cleans up
    while time.monotonic() < deadline and (_agent_procs(node_root) or _mounts(node_root)):
        time.sleep(0.5)
    assert not _agent_procs(node_root) and _mounts(node_root) == [] and _cgroups({env.id}) == []
    shutil.rmtree(node_root)  # that node's disk: a returning node would reuse and clean it
