"""The cluster simulator: exact accounting on a tiny pool, strategy ordering on a small one, the
`bench cluster-sim` command end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollstack.cluster.placement import PlacementPolicy
from rollstack_bench.cluster_model import MB, Costs, Workload, simulate
from rollstack.errors import InvalidRequest


def _strip_timing(doc):
    doc = dict(doc, decisions_per_s=0)
    doc["iterations"] = [dict(x, placement_s=0, decisions_per_s=0) for x in doc["iterations"]]
    return doc


def test_one_node_one_task_accounting_is_exact():
    w = Workload(nodes=1, envs=8, group_size=8, iterations=2, repos=1, tasks=1, os_bytes=100 * MB,
                 harness_bytes=200 * MB, repo_bytes=50 * MB, read_fraction=0.1, task_bytes=5 * MB, slots=8)
    costs = Costs(create_s=0.1, cold_create_s=0.3, link_bytes_per_s=10 * MB, rollout_s=1.0, concurrency=2)
    r = simulate("cache-aware", w, costs)
    cold, warm = r["iterations"]
    assert cold["placed"] == warm["placed"] == 8 and cold["rejected"] == 0
    # 10% of 350 MB of layers + the task's 5 MB, fetched once; nothing the second time
    assert cold["registry_egress_bytes"] == 40 * MB and warm["registry_egress_bytes"] == 0
    # first env: the 40 MB at 10 MB/s arrive at 4.0 s (> its 0.3 s create); the second one
    # (other worker, starts at 0) waits for the same bytes; warm: 8 creates of 0.1 s on 2 workers
    assert cold["init_p50_s"] == pytest.approx(4.1) and cold["init_max_s"] == pytest.approx(4.0 + 3 * 0.1)
    assert warm["init_max_s"] == pytest.approx(0.4) and warm["hot_hit_ratio"] == 1.0
    assert cold["grpo_colocation"] == warm["grpo_colocation"] == 1.0
    assert warm["makespan_s"] == pytest.approx(1.4)


def test_pool_too_small_rejects_the_overflow():
    r = simulate("round-robin", Workload(nodes=2, envs=40, slots=10, iterations=1, tasks=10))
    assert r["iterations"][0]["placed"] == 20 and r["rejected_total"] == 20


# 23 nodes: with interleaved arrivals round robin co-locates whole groups when the task count
# is a multiple of the node count (rollout r of task t lands on (r * tasks + t) mod nodes).
SMALL = Workload(nodes=23, envs=800, iterations=3, repos=12, tasks=400)


@pytest.fixture(scope="module")
def small():
    return {s: simulate(s, SMALL) for s in ("cache-aware", "round-robin", "least-loaded", "best-of-k")}


def test_cache_aware_beats_the_baselines_on_egress_colocation_and_hits(small):
    ca = small["cache-aware"]
    for name in ("round-robin", "least-loaded", "best-of-k"):
        other = small[name]
        assert ca["registry_egress_bytes_total"] < other["registry_egress_bytes_total"], name
        assert ca["warm"]["grpo_colocation"] > other["warm"]["grpo_colocation"], name
        assert ca["warm"]["hot_hit_ratio"] >= other["warm"]["hot_hit_ratio"], name
    assert ca["warm"]["grpo_colocation"] > 0.95


def test_every_strategy_respects_slots_and_warm_iterations_fetch_less(small):
    for r in small.values():
        for it in r["iterations"]:
            assert it["placed"] == SMALL.envs and it["envs_per_node_max"] <= SMALL.node_slots()
        assert r["iterations"][-1]["registry_egress_bytes"] < r["iterations"][0]["registry_egress_bytes"]


def test_simulation_is_deterministic():
    w = Workload(nodes=10, envs=200, iterations=2, tasks=100)
    for s in ("cache-aware", "best-of-k"):
        assert _strip_timing(simulate(s, w)) == _strip_timing(simulate(s, w))


@pytest.mark.parametrize("kwargs", [dict(nodes=0), dict(read_fraction=2.0), dict(order="random"), dict(repos=0)])
def test_bad_workloads_are_invalid(kwargs):
    with pytest.raises(InvalidRequest):
        simulate("cache-aware", Workload(**kwargs))


def test_bad_strategy_policy_and_costs_are_invalid():
    with pytest.raises(InvalidRequest):
        simulate("random", Workload(nodes=2, envs=8))
    with pytest.raises(InvalidRequest):
        simulate("cache-aware", Workload(nodes=2, envs=8), policy=PlacementPolicy(spread_limit=0))
    with pytest.raises(InvalidRequest):
        simulate("cache-aware", Workload(nodes=2, envs=8), Costs(concurrency=0))


def _cli(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "rollstack.cli.main", "bench", "cluster-sim", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_bench_cluster_sim_json():
    p = _cli("--nodes", "10", "--envs", "200", "--tasks", "100", "--iterations", "2",
             "--rate-nodes", "50", "--rate-decisions", "400", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc["strategies"]) == {"cache-aware", "round-robin", "least-loaded", "best-of-k"}
    assert doc["workload"]["nodes"] == 10 and doc["workload"]["node_slots"] == 25
    rate = doc["placement_rate"]
    assert rate["nodes"] == 50 and all(rate[s] > 0 for s in doc["strategies"])
    assert "create_s" in doc["sources"] and doc["costs"]["create_s"] == 0.1


def test_bench_cluster_sim_bad_flag_is_a_clear_error():
    p = _cli("--strategies", "cache-aware,nope", "--rate-decisions", "0")
    assert p.returncode != 0
    assert "error: invalid_request: unknown strategy 'nope'" in p.stderr


def test_peers_move_misses_off_the_registry_without_changing_what_nodes_fetch(small):
    peers = {s: simulate(s, Workload(**{**SMALL.__dict__, "peers": True})) for s in small}
    unique = {r["registry_egress_bytes_total"] for r in peers.values()}
    assert len(unique) == 1  # the registry serves each chunk set once, whatever the placement
    for s, r in peers.items():
        assert r["registry_egress_bytes_total"] + r["peer_bytes_total"] == small[s]["registry_egress_bytes_total"]
        assert small[s]["peer_bytes_total"] == 0
    assert all(peers["cache-aware"]["peer_bytes_total"] < peers[s]["peer_bytes_total"] for s in peers if s != "cache-aware")
