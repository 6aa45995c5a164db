"""`rollstack bench cluster-sim`: placement strategies side by side on a simulated pool.

Runs `rollstack_bench.cluster_model.simulate` once per strategy (cache-aware, round-robin, least-loaded,
best-of-k) on the same workload and costs, then measures the placement function's own rate on one
core at `--rate-nodes` nodes. Every default cost comes from a figure measured on this machine;
`SOURCES` says which (printed with the report and kept in the JSON).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import sys
import time
from typing import Any

import typer

from rollstack_bench.report import current_command, machine_facts
from rollstack.cluster.placement import NodeView, PlacementIndex, PlacementPolicy, PlacementRequest, place
from rollstack_bench.placement_baselines import STRATEGIES, make, place_with
from rollstack_bench.cluster_model import MB, Costs, Workload, simulate
from rollstack.errors import InvalidRequest

SOURCES = {
    "create_s": "0.10 s: warm create p50 in `bench iteration` (docs/benchmarks.md, 64- and 256-rollout runs: 0.10-0.11 s)",
    "cold_create_s": "0.28 s: cold create to ready in `bench init` (docs/benchmarks.md: resolve+TOCs+mount+mutation+runc 0.28 s)",
    "link_gbit": "0.9 Gbit/s: the `dc` link profile as measured (docs/benchmarks.md: 0.87-0.93 Gbit/s)",
    "rollout_s": "7.2 s: rollout p50 after init in `bench iteration` 64-rollout run (docs/benchmarks.md)",
    "concurrency": "4: creates in flight per node, as `bench iteration` runs them (4 in flight); not a measured node limit",
    "os_mb": "112 MB: stored os layer group of the small corpus (docs/benchmarks.md, `bench corpus publish`)",
    "harness_mb": "239 MB: stored mini-swe-agent harness group (docs/benchmarks.md, `bench corpus publish`)",
    "repo_mb": "100 MB: NOT measured here (the corpus's repositories store 1.6 MB); a SWE-bench-like per-repository "
               "environment layer, set with --repo-mb",
    "read_fraction": "0.05: ~20 MB read before the first command finishes (3.1 MB before ready + 16.7 MB on demand, "
                     "docs/benchmarks.md) over ~460 MB of stored groups; a full rollout reads more",
    "task_mb": "3 MB: bytes of a task of its own (not shared with other tasks of the stack): the 3.1 MB fetched "
               "before ready (docs/benchmarks.md); a GRPO group's first rollout on a cold node pulls 10.7 MB, its "
               "rollouts 2-8 35 KB each (README, bench fetch --only grpo)",
    "slots": "ceil(1.25 * envs / nodes): the pool 80% full at the iteration's peak (a choice, not a measurement)",
    "cache_gb": "50 GB per node chunk cache (a choice; the node's cache bound is a config value)",
    "repos/tasks/zipf": "40 repositories, 5,000 tasks, Zipf 1.1 popularity: a synthetic SWE-bench-like universe",
}


def rate(nodes: int = 1000, decisions: int = 10_000, repos: int = 40, seed: int = 0,
         policy: PlacementPolicy = PlacementPolicy(), rebuild_decisions: int = 200, repeats: int = 3) -> dict[str, Any]:
    """Decisions per second at `nodes` nodes, pinned to one core: each strategy on a kept
    `PlacementIndex` (the live view's path) with GRPO groups of 8 (7 of 8 decisions then only
    score the group's node), cache-aware without trace keys (every decision scans all nodes), and
    `place()` from a list of NodeViews (index rebuilt per call). Each is the best of `repeats`
    passes (the machine is shared: the best pass is the least disturbed; medians are kept too)."""
    rng = random.Random(seed)
    repo_layers = [(f"sha256:repo-{r:03d}", 100 * MB) for r in range(repos)]
    common = [("sha256:os", 112 * MB), ("sha256:harness", 239 * MB)]
    views = [NodeView(f"node-{i:05d}", f"sim://{i}", rng.random() > 0.02, 64.0, 256 << 30, 10 * decisions // nodes + 8,
                      frozenset(["sha256:os", "sha256:harness", *(d for d, _ in rng.sample(repo_layers, 10))]), {})
             for i in range(nodes)]
    reqs = []
    for t in range(decisions // 8 + 1):
        repo = repo_layers[min(int(rng.paretovariate(1.1)) - 1, repos - 1)]
        layers = (common[0], repo, common[1])
        reqs += [PlacementRequest(layers, f"task-{t}", 1.0, 2 << 30)] * 8
    reqs = reqs[:decisions]
    allowed = os.sched_getaffinity(0)
    out: dict[str, Any] = {"nodes": nodes, "decisions": decisions, "cpu": min(allowed), "repeats": repeats}

    def best(label: str, make_pass) -> None:
        rates = []
        for _ in range(repeats):
            fn, n = make_pass()
            t0 = time.perf_counter()
            fn()
            rates.append(n / (time.perf_counter() - t0))
        out[label] = max(rates)
        out[f"{label}_median"] = sorted(rates)[len(rates) // 2]

    def strategy_pass(name: str):
        strategy, index = make(name, policy, seed=seed), PlacementIndex(views, policy)
        return (lambda: [place_with(strategy, r, index) for r in reqs]), len(reqs)

    def groupless_pass():
        index, plain = PlacementIndex(views, policy), [PlacementRequest(r.layers, None, r.cpu, r.memory) for r in reqs]
        return (lambda: [place(r, index, policy) for r in plain]), len(plain)

    os.sched_setaffinity(0, {min(allowed)})
    try:
        for name in STRATEGIES:
            best(name, lambda: strategy_pass(name))
        best("cache-aware_no_trace_key", groupless_pass)  # every decision scans all nodes
        best("cache-aware_rebuild_per_call",
             lambda: ((lambda: [place(r, views, policy) for r in reqs[:rebuild_decisions]]), rebuild_decisions))
        t0 = time.perf_counter()
        PlacementIndex(views, policy)
        out["index_build_s"] = time.perf_counter() - t0
    finally:
        os.sched_setaffinity(0, allowed)
    return out


def run(w: Workload, costs: Costs, policy: PlacementPolicy, strategies: list[str], k: int,
        rate_nodes: int, rate_decisions: int) -> dict[str, Any]:
    results = {name: simulate(name, w, costs, policy, k=k) for name in strategies}
    return {
        "benchmark": "cluster-sim",
        "command": _command(),
        "machine": machine_facts(),
        "workload": w.__dict__ | {"node_slots": w.node_slots()},
        "costs": costs.__dict__,
        "policy": policy.__dict__,
        "best_of_k": k,
        "sources": SOURCES,
        "strategies": results,
        "placement_rate": rate(rate_nodes, rate_decisions, w.repos, w.seed, policy) if rate_decisions else None,
    }


def _command() -> str:
    """This command line as a user types it (also under `python -m rollstack.cli.main`)."""
    argv = sys.argv[1:]
    return shlex.join(["rollstack", *argv]) if argv[:1] == ["bench"] else current_command()


def _human(doc: dict[str, Any]) -> None:
    w = doc["workload"]
    print(f"cluster-sim: {w['nodes']} nodes x {w['node_slots']} slots, {w['envs']} envs/iteration "
          f"({w['group_size']} rollouts/task, {w['order']}), {w['iterations']} iterations")
    head = ("strategy", "hot hit cold/warm", "co-location", "registry GB per it.", "peer GB", "init p50 cold/warm",
            "init p95 cold/warm", "nodes used", "sim dec/s")
    rows = []
    for name, r in doc["strategies"].items():
        its = r["iterations"]
        rows.append((name, f"{its[0]['hot_hit_ratio']:.3f} / {its[-1]['hot_hit_ratio']:.3f}",
                     f"{its[-1]['grpo_colocation']:.3f}",
                     " / ".join(f"{x['registry_egress_bytes'] / 1e9:.1f}" for x in its),
                     f"{r['peer_bytes_total'] / 1e9:.1f}",
                     f"{its[0]['init_p50_s']:.2f} / {its[-1]['init_p50_s']:.2f}",
                     f"{its[0]['init_p95_s']:.2f} / {its[-1]['init_p95_s']:.2f}",
                     str(its[-1]["nodes_used"]), f"{r['decisions_per_s']:,.0f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in (head, *rows):
        print("  ".join(str(x).ljust(n) for x, n in zip(row, widths)))
    rate_doc = doc.get("placement_rate")
    if rate_doc:
        print(f"placement rate on one core at {rate_doc['nodes']} nodes ({rate_doc['decisions']} decisions, "
              f"best of {rate_doc['repeats']}): "
              + ", ".join(f"{n} {rate_doc[n]:,.0f}/s" for n in STRATEGIES)
              + f"; cache-aware without trace keys {rate_doc['cache-aware_no_trace_key']:,.0f}/s"
              + f"; place() rebuilding the index per call {rate_doc['cache-aware_rebuild_per_call']:,.0f}/s"
              f" (index build {rate_doc['index_build_s'] * 1000:.1f} ms)")
    print("defaults from:")
    for key, src in doc["sources"].items():
        print(f"  {key}: {src}")


def register(app: typer.Typer) -> None:
    @app.command("cluster-sim")
    def cluster_sim_bench(
        nodes: int = typer.Option(200, "--nodes"),
        envs: int = typer.Option(10_000, "--envs", help="environments per iteration"),
        iterations: int = typer.Option(3, "--iterations", help="iteration 1 starts from cold node caches"),
        group_size: int = typer.Option(8, "--group-size", help="rollouts per task (GRPO group)"),
        order: str = typer.Option("interleaved", "--order", help="interleaved (rollout 1 of every task first) or grouped"),
        repos: int = typer.Option(40, "--repos"),
        tasks: int = typer.Option(5_000, "--tasks", help="task universe the iterations sample from"),
        strategies: str = typer.Option(",".join(STRATEGIES), "--strategies"),
        k: int = typer.Option(3, "--k", help="K of best-of-k"),
        spread_limit: int = typer.Option(8, "--spread-limit"),
        hot_weight: float = typer.Option(PlacementPolicy.hot_weight, "--hot-weight"),
        load_weight: float = typer.Option(PlacementPolicy.load_weight, "--load-weight"),
        load_band: float = typer.Option(PlacementPolicy.load_band, "--load-band",
                                        help="free-fraction band of comparable load (negative: no band)"),
        no_reserve: bool = typer.Option(False, "--no-reserve", help="cache-aware without group reservations"),
        create_s: float = typer.Option(Costs.create_s, "--create-s"),
        cold_create_s: float = typer.Option(Costs.cold_create_s, "--cold-create-s"),
        link_gbit: float = typer.Option(0.9, "--link-gbit"),
        rollout_s: float = typer.Option(Costs.rollout_s, "--rollout-s"),
        concurrency: int = typer.Option(Costs.concurrency, "--concurrency"),
        os_mb: float = typer.Option(112, "--os-mb"),
        harness_mb: float = typer.Option(239, "--harness-mb"),
        repo_mb: float = typer.Option(100, "--repo-mb"),
        read_fraction: float = typer.Option(Workload.read_fraction, "--read-fraction"),
        task_mb: float = typer.Option(3, "--task-mb"),
        slots: int = typer.Option(0, "--slots", help="per node (0: 1.25 x envs / nodes)"),
        cache_gb: float = typer.Option(50, "--cache-gb"),
        peers: bool = typer.Option(False, "--peers", help="misses another node holds come from it, not the registry"),
        rate_nodes: int = typer.Option(1000, "--rate-nodes", help="nodes for the placement-rate measurement"),
        rate_decisions: int = typer.Option(10_000, "--rate-decisions", help="0 skips the rate measurement"),
        seed: int = typer.Option(0, "--seed"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Cache-aware placement vs round robin, least-loaded and best-of-K on a simulated pool."""
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        for n in names:
            if n not in STRATEGIES:
                raise InvalidRequest(f"unknown strategy {n!r} (known: {', '.join(STRATEGIES)})")
        if link_gbit <= 0 or concurrency < 1 or rate_nodes < 1 or rate_decisions < 0:
            raise InvalidRequest("--link-gbit must be > 0, --concurrency and --rate-nodes >= 1, --rate-decisions >= 0")
        w = Workload(nodes=nodes, envs=envs, group_size=group_size, iterations=iterations, repos=repos, tasks=tasks,
                     os_bytes=int(os_mb * MB), harness_bytes=int(harness_mb * MB), repo_bytes=int(repo_mb * MB),
                     read_fraction=read_fraction, task_bytes=int(task_mb * MB), slots=slots,
                     cache_bytes=int(cache_gb * 1000 * MB), order=order, peers=peers, seed=seed)
        costs = Costs(create_s=create_s, cold_create_s=cold_create_s, link_bytes_per_s=link_gbit * 1e9 / 8,
                      rollout_s=rollout_s, concurrency=concurrency)
        policy = PlacementPolicy(spread_limit=spread_limit, group_reserve=not no_reserve,
                                 hot_weight=hot_weight, load_weight=load_weight,
                                 load_band=load_band if load_band >= 0 else None)
        doc = run(w, costs, policy, names, k, rate_nodes, rate_decisions)
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            _human(doc)
