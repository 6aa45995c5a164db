"""`rollstack bench cluster`: a GRPO iteration on N Ray nodes on this host vs the same on 1.

Setup: each node in its own network namespace behind a tc-shaped link (`--link`, default dc;
rollstack_bench.cluster_net), a real docker-registry on the host side of those links holding a busybox corpus (os/busybox:1 and a repo
group with one file per task plus an incompressible `data.bin` every test run reads, so each
node must get its bytes from somewhere), a `ray.cluster_utils` cluster (real GCS + raylets, each
node with the `rollstack` resource) and `rollstack.cluster.up` on it. Each iteration is the GRPO
driver (`rollstack.integrations.grpo.run_batch`, the scripted policy: test, fix, test, score)
over an `AsyncPool`, tasks x rollouts, lazy fetch without background fill.

Runs, in order:
1. `single`: 1 Ray node, cold caches: registry bytes of one iteration (the reference);
2. `cluster`: N nodes, cold caches: per-node placement, hot-layer hit ratio (share of the
   stack's bytes already hot on the chosen node at placement time), registry bytes (ratio to
   `single`; peers serve the rest), init p50/p95 (driver-side create wall time);
3. `kill`: the same N nodes (warm), one node's agent and daemon SIGKILLed when ~40% of the
   iteration's wall has passed: `node_lost` detection time, time until the pool stops placing
   there, rollouts lost after resampling (must be 0), resamples.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rollstack.errors import InvalidRequest

DEFAULT_OUT = Path("results/cluster")
TEMPLATE = {
    "groups": ["os/busybox:1", "repo/{repo}:{version}"],
    "workdir": "{workdir}",
    "resources": {"cpu": 0.25, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"},
    "fetch": {"background": False},
    "timeout": 600,
    "evaluator": {"groups": ["os/busybox:1", "repo/{repo}:{version}"], "command": 'eval "$RS_TEST_COMMAND"'},
}


def _log(msg: str) -> None:
    print(f"[bench cluster] {msg}", file=sys.stderr, flush=True)


# -- corpus ---------------------------------------------------------------------------------------

def build_corpus(work: Path, n_tasks: int, blob_bytes: int) -> tuple[dict[str, Path], list[dict[str, Any]]]:
    """Trees (os, repo) and SWE-smith-style tasks: task i breaks t<i>.txt; its test reads data.bin."""
    from rollstack_bench.env import build_busybox_trees

    trees = build_busybox_trees(work / "trees")
    repo = work / "repo" / "work" / "app"
    repo.mkdir(parents=True)
    (repo / "data.bin").write_bytes(os.urandom(blob_bytes))
    tasks = []
    for i in range(n_tasks):
        (repo / f"t{i}.txt").write_text("hello\n")
        bug = f"--- a/t{i}.txt\n+++ b/t{i}.txt\n@@ -1 +1 @@\n-hello\n+bug\n"
        fix = f"--- a/t{i}.txt\n+++ b/t{i}.txt\n@@ -1 +1 @@\n-bug\n+hello\n"
        tasks.append({"instance_id": f"app.1.t{i}__{i}", "repo": "app", "version": "1", "workdir": "/work/app",
                      "patch": bug, "fix": fix, "FAIL_TO_PASS": [f"t{i}.txt::hello"], "PASS_TO_PASS": [],
                      "test_command": f"cat data.bin >/dev/null && grep -qx hello t{i}.txt"})
    return {"os": trees["os"], "repo": work / "repo"}, tasks


def publish(spec: str, trees: dict[str, Path], work: Path) -> None:
    from rollstack.plan.groups import publish_group
    from rollstack.store import open_store

    work.mkdir(parents=True, exist_ok=True)
    store = open_store(spec)
    try:
        publish_group(store, "os/busybox:1", [trees["os"]], work_dir=work)
        publish_group(store, "repo/app:1", [trees["repo"]], work_dir=work)
    finally:
        getattr(store, "close", lambda: None)()


# -- measurement ------------------------------------------------------------------------------------

def _pctl(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def daemon_stats(root: Path) -> dict[str, dict[str, Any]]:
    """Each node's lazy store stats, by node directory name."""
    from rollstack.lazystore.client import LazyStoreClient

    out = {}
    for node in sorted(p for p in root.iterdir() if (p / "lazy" / "state" / "control.sock").exists()):
        c = LazyStoreClient.connect(node / "lazy" / "mnt", node / "lazy" / "state")
        try:
            out[node.name] = c.stats()
        finally:
            c._http.close()  # noqa: SLF001
    return out


def egress(stats: dict[str, dict[str, Any]]) -> dict[str, int]:
    reg = sum(int(s["fetch"]["transferred_bytes"].get("registry", 0)) for s in stats.values())
    peer = sum(int(s["fetch"]["transferred_bytes"].get("peer", 0)) for s in stats.values())
    return {"registry_bytes": reg, "peer_bytes": peer}


def node_pids(node_root: Path) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if str(node_root).encode() in cmd and (b"rollstack.node.agent" in cmd or b"rollstack.lazystore.daemon" in cmd):
            out.append(int(p.name))
    return out


def iteration(address: str, tasks: list[dict[str, Any]], k: int, concurrency: int,
              kill: tuple[float, Path] | None = None) -> dict[str, Any]:
    """One GRPO iteration over an AsyncPool; with `kill=(after_s, nodes_root)`, SIGKILL the agent
    and daemon of the node holding most environments after `after_s` seconds."""
    from rollstack.cluster.pool import AsyncPool
    from rollstack.integrations.grpo import RetryPolicy, run_batch
    from rollstack.integrations.policies import ScriptedPolicy
    from rollstack.integrations.tasks import SweTask

    swe = [SweTask.model_validate(t) for t in tasks]
    killed: dict[str, Any] = {}

    async def go() -> Any:
        async with AsyncPool(address, interval=0.5) as pool:
            def killer() -> None:
                time.sleep(kill[0])  # type: ignore[index]

                def live(n: str) -> int:
                    return int((pool.directory.members[n].info or {}).get("environments", 0))

                deadline = time.monotonic() + 20  # the node with most live environments (at least one)
                while True:
                    views = [v.node_id for v in pool.nodes() if v.alive]
                    victim = max(views, key=live)
                    if live(victim) > 0 or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                pids = node_pids(kill[1] / victim.removeprefix("rollstack-node-"))  # type: ignore[index]
                killed.update(node=victim, pids=pids, at=time.monotonic(),
                              live_envs=int((pool.directory.members[victim].info or {}).get("environments", 0)))
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _log(f"killed {victim} (pids {pids}) with {killed['live_envs']} environments")

            t = threading.Thread(target=killer, daemon=True) if kill else None
            if t is not None:
                t.start()
            t0 = time.monotonic()
            report, groups = await run_batch(pool, swe, k, ScriptedPolicy(120), template=TEMPLATE,
                                             concurrency=concurrency, retry=RetryPolicy(max_resamples=3))
            wall = time.monotonic() - t0
            if t is not None:
                t.join(timeout=60)
            core = pool._core  # noqa: SLF001
            decisions = list(core.decisions)
            dead = core.directory.died_at.get(killed["node"]) if killed else None
            return report, groups, wall, decisions, dict(core.first_lost), dead

    report, groups, wall, decisions, first_lost, dead_since = asyncio.run(go())
    flat = [r for g in groups for r in g]
    per_node: dict[str, int] = {}
    created = [d for d in decisions if d["created"]]
    for d in created:
        per_node[d["node"]] = per_node.get(d["node"], 0) + 1
    out: dict[str, Any] = {
        "rollouts": len(flat), "ok": sum(1 for r in flat if r.status == "ok" and r.reward == 1.0),
        "lost": sum(1 for r in flat if r.status != "ok"), "resampled": sum(r.resamples for r in flat),
        "requeued": sum(r.requeues for r in flat),
        "errors": sorted({r.error for r in flat if r.error}), "wall_s": round(wall, 2),
        "init_p50_s": round(_pctl([r.init_seconds for r in flat if r.status == "ok"], 0.5), 3),
        "init_p95_s": round(_pctl([r.init_seconds for r in flat if r.status == "ok"], 0.95), 3),
        "placements": dict(sorted(per_node.items())),
        "placements_refused": len(decisions) - len(created),
        "hot_layer_hit_ratio": round(statistics.fmean(d["hot"] for d in created), 4) if created else None,
        "creates_on_fully_hot_node": round(sum(1 for d in created if d["hot"] >= 0.999) / len(created), 4)
        if created else None,
    }
    if killed:
        lost_at = first_lost.get(killed["node"])
        out["kill"] = {
            "node": killed["node"], "live_envs_at_kill": killed["live_envs"],
            "detect_s": round(lost_at - killed["at"], 3) if lost_at else None,
            "stop_placing_s": round(dead_since - killed["at"], 3) if dead_since and dead_since >= killed["at"] else None,
            "first_create_on_it_again_s": next((round(d["t"] - killed["at"], 3) for d in created
                                                if d["node"] == killed["node"] and d["t"] > killed["at"]), None),
        }
    return out


# -- the run ------------------------------------------------------------------------------------

def _cluster(nodes: int, nets: list[Any] | None = None) -> Any:
    from ray.cluster_utils import Cluster

    def env(i: int) -> dict[str, Any]:  # the raylet's environment: its node agent's netns
        return {"env_vars": nets[i].env} if nets else {}

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"rollstack": 1},
                                                      "include_dashboard": False, **env(0)})
    for i in range(nodes - 1):
        c.add_node(num_cpus=1, resources={"rollstack": 1}, **env(i + 1))
    c.wait_for_nodes()
    return c


def _with_cluster(nodes: int, spec: str, root: Path, options: dict[str, Any], fn: Any,
                  nets: list[Any] | None = None) -> Any:
    import ray

    import rollstack.cluster as rc

    cluster = _cluster(nodes, nets)
    try:
        t0 = time.monotonic()
        rc.up(cluster.address, spec, root=root, options=options)
        _log(f"{nodes} node agents up in {time.monotonic() - t0:.1f}s")
        return fn(cluster.address)
    finally:
        try:
            rc.down(cluster.address)
        finally:
            ray.shutdown()
            cluster.shutdown()


def run(nodes: int, n_tasks: int, k: int, concurrency: int, blob_mb: float, work: Path,
        node_cpu: float = 2.0, node_slots: int = 8, link: str | None = "dc") -> dict[str, Any]:
    """`link`: each node in its own network namespace behind a shaped link of that profile
    (rollstack_bench.cluster_net); None: all nodes on this host's loopback."""
    from contextlib import nullcontext

    from rollstack_bench.cluster_net import Fabric

    with (Fabric(nodes, link) if link else nullcontext()) as fabric:
        return _run(nodes, n_tasks, k, concurrency, blob_mb, work, node_cpu, node_slots, fabric)


def _link_delta(fabric: Any, before: dict[str, Any] | None) -> dict[str, Any]:
    now = fabric.counters()
    if before is None:
        return now
    rx = [a - b for a, b in zip(now["node_rx_bytes"], before["node_rx_bytes"])]
    return {"link_host_tx_bytes": now["host_tx_bytes"] - before["host_tx_bytes"], "link_node_rx_bytes": rx}


def _run(nodes: int, n_tasks: int, k: int, concurrency: int, blob_mb: float, work: Path,
         node_cpu: float, node_slots: int, fabric: Any) -> dict[str, Any]:
    from rollstack.store.server import RegistryServer

    if nodes < 2:
        raise InvalidRequest("--nodes must be >= 2 (the reference run is the 1-node one)")
    trees, tasks = build_corpus(work / "corpus", n_tasks, int(blob_mb * (1 << 20)))
    doc: dict[str, Any] = {"config": {"nodes": nodes, "tasks": n_tasks, "rollouts_per_task": k,
                                      "concurrency": concurrency, "blob_mb": blob_mb, "cores": os.cpu_count(),
                                      "node_cpu": node_cpu, "node_slots": node_slots,
                                      "env_cpu": TEMPLATE["resources"]["cpu"],
                                      "network": fabric.facts() if fabric else "loopback (no netns)"}}
    nets = fabric.nodes if fabric else None
    # Each node admits node_cpu cores of start quotas (several nodes share this host); layers are
    # not materialized (a materializing node reads whole layers: see docs/cluster.md).
    options = {"max_environments": node_slots, "lowers": {"materialize_after": 0}, "capacity_cpu": node_cpu}
    addr = f"{fabric.host_ip}:0" if fabric else "127.0.0.1:0"
    with RegistryServer(work / "registry", addr, die_with_parent=True) as reg:
        spec = reg.url
        publish(spec, trees, work / "publish")
        _log(f"registry {spec}: corpus published ({n_tasks} tasks)")

        def measured(address: str, cluster: str) -> dict[str, Any]:
            """One iteration on the cluster at `address` (its nodes under work/<cluster>), with
            the registry egress its daemons counted and, on a fabric, the bytes its links carried."""
            before = fabric.counters() if fabric else None
            res = iteration(address, tasks, k, concurrency)
            res.update(egress(daemon_stats(work / cluster)))
            if fabric:
                res.update(_link_delta(fabric, before))
            return res

        def single(address: str) -> dict[str, Any]:
            return measured(address, "single")

        # the reference node gets the whole pool's admission slots (same capacity, one cache)
        doc["single"] = _with_cluster(1, spec, work / "single", options | {"max_environments": node_slots * nodes},
                                      single, nets[:1] if nets else None)
        _log(f"1 node: {json.dumps(doc['single'])}")

        def many(address: str) -> dict[str, Any]:
            res = measured(address, "many")
            doc["cluster"] = res
            _log(f"{nodes} nodes: {json.dumps(res)}")
            killed = iteration(address, tasks, k, concurrency, kill=(0.4 * res["wall_s"], work / "many"))
            _log(f"{nodes} nodes with a kill: {json.dumps(killed)}")
            return killed

        doc["kill"] = _with_cluster(nodes, spec, work / "many", options, many, nets)
    s, c = doc["single"], doc["cluster"]
    doc["summary"] = {
        "registry_egress_ratio": round(c["registry_bytes"] / s["registry_bytes"], 3) if s["registry_bytes"] else None,
        "hot_layer_hit_ratio": c["hot_layer_hit_ratio"], "init_p50_s": c["init_p50_s"], "init_p95_s": c["init_p95_s"],
        "rollouts_lost_after_resampling": doc["kill"]["lost"], "node_lost_detect_s": doc["kill"]["kill"]["detect_s"],
        "stop_placing_s": doc["kill"]["kill"]["stop_placing_s"],
    }
    if "link_host_tx_bytes" in c and s.get("link_host_tx_bytes"):
        doc["summary"]["link_registry_egress_ratio"] = round(c["link_host_tx_bytes"] / s["link_host_tx_bytes"], 3)
    return doc


def register(app: typer.Typer) -> None:
    @app.command("cluster")
    def bench_cluster(
        nodes: Annotated[int, typer.Option("--nodes", help="Ray nodes (node agents) on this host")] = 4,
        tasks: Annotated[int, typer.Option("--tasks", help="GRPO tasks")] = 16,
        rollouts: Annotated[int, typer.Option("--rollouts", help="rollouts per task")] = 8,
        concurrency: Annotated[int, typer.Option("--concurrency", help="rollouts in flight")] = 16,
        blob_mb: Annotated[float, typer.Option("--blob-mb", help="MiB of data every test run reads")] = 8.0,
        node_cpu: Annotated[float, typer.Option("--node-cpu", help="cores each node admits")] = 2.0,
        node_slots: Annotated[int, typer.Option("--node-slots", help="environments each node admits")] = 8,
        link: Annotated[str, typer.Option("--link", help="each node's own shaped link (netns): lan, dc, wan; "
                                                        "'none': all nodes on loopback")] = "dc",
        out: Annotated[Path, typer.Option("--out", help="report directory")] = DEFAULT_OUT,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    ) -> None:
        """A GRPO iteration on N Ray nodes vs 1: placement, hot layers, registry egress, init, a node kill."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rs-bench-cluster-") as tmp:
            doc = run(nodes, tasks, rollouts, concurrency, blob_mb, Path(tmp), node_cpu, node_slots,
                      None if link == "none" else link)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cluster.json").write_text(json.dumps(doc, indent=2))
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            for key, value in doc["summary"].items():
                print(f"{key:34} {value}")
