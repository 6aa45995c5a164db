"""`bench node`'s GRPO fan-out: one environment vs a group of N (`create(plan, count=N)`), as
create only and as create + one `exec true` in each, with the node's warm pool and without.

Each round creates one environment, then a group (alternated, so a drift of the shared machine
hits both), after `settle` (background destroys done, the warm pool refilled: the idle time
between two GRPO iterations). The execs run on N caller threads made once, whose per-thread
SDK connections exist before the first round (a harness's long-lived rollout workers): the
figure is the node's, not the cost of starting threads and connections in the caller. Node CPU
is the agent's (with the `runc` children it reaps) plus the lazy store daemon's, summed over
the rounds (the kernel counts it in 10 ms ticks) and divided by them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WARM_POOL = 16
"""Warm pool of the node that measures the warm case when `bench node` runs without `--warm`."""


def measure(client: Any, plan: dict[str, Any], count: int, rounds: int, warm: int,
            pids: list[int]) -> dict[str, Any]:
    from rollstack_bench.node_common import _cpu, settle

    with ThreadPoolExecutor(max_workers=count) as pool:
        list(pool.map(lambda _: client.health(), range(count)))  # each caller thread's connection
        samples: dict[int, list[Sample]] = {1: [], count: []}
        shared: list[dict[str, float]] = []

        def group(n: int) -> None:
            settle(client, warm)
            cpu0 = _cpu(pids)
            t = time.perf_counter()
            envs = client.create(plan, count=n) if n > 1 else [client.create(plan)]
            created = time.perf_counter() - t
            cpu1 = _cpu(pids)
            list(pool.map(lambda e: e.exec(["true"]), envs))
            wall = time.perf_counter() - t
            cpu2 = _cpu(pids)
            timings = envs[0].created.timings
            samples[n].append((created, wall, cpu1 - cpu0, cpu2 - cpu0, all(e.created.timings.warm for e in envs)))
            if n > 1 and timings.group:
                shared.append(dict(timings.group))
            for e in envs:
                e.destroy()

        for _ in range(rounds):
            group(1)
            group(count)
    return summarize(samples[1], samples[count], count, warm, shared)


Sample = tuple[float, float, float, float, bool]
"""(create s, create + exec s, node CPU s of the create, of create + exec, every env warm)."""


def summarize(one: list[Sample], many: list[Sample], count: int, warm: int,
              shared: list[dict[str, float]]) -> dict[str, Any]:
    """The fan-out document from the rounds' samples (pure): medians of the times, means of the
    CPU (10 ms ticks: a median of ticks would be 0 or 10 ms)."""
    from rollstack_bench.node_common import _pct

    med = lambda rows, i: _pct([r[i] for r in rows], 50)  # noqa: E731
    mean = lambda rows, i: round(sum(r[i] for r in rows) / len(rows), 6)  # noqa: E731
    doc: dict[str, Any] = {
        "count": count, "rounds": len(many), "warm_pool": warm,
        "one_s": med(one, 1), "group_s": med(many, 1), "ratio": round(med(many, 1) / med(one, 1), 2),
        "one_create_s": med(one, 0), "group_create_s": med(many, 0),
        "create_ratio": round(med(many, 0) / med(one, 0), 2),
        "one_create_node_cpu_s": mean(one, 2), "group_create_node_cpu_s": mean(many, 2),
        "one_node_cpu_s": mean(one, 3), "group_node_cpu_s": mean(many, 3),
        "all_warm_rounds": sum(1 for r in many if r[4]),
    }
    doc["create_node_cpu_per_extra_env_s"] = round(
        (doc["group_create_node_cpu_s"] - doc["one_create_node_cpu_s"]) / max(1, count - 1), 6)
    if shared:
        doc["group_shared_phases_s"] = {k: _pct([s.get(k, 0.0) for s in shared], 50) for k in shared[0]}
    return doc


def mode_summary(f: dict[str, Any]) -> dict[str, Any]:
    """fanout_{warm|cold}_{ratio,create_ratio,cpu_ms_per_extra_env} of one fan-out document."""
    mode = "warm" if f["warm_pool"] else "cold"
    return {f"fanout_{mode}_ratio": f["ratio"], f"fanout_{mode}_create_ratio": f["create_ratio"],
            f"fanout_{mode}_cpu_ms_per_extra_env": round(f["create_node_cpu_per_extra_env_s"] * 1e3, 2)}


def node_pids(config: Any, agent_pid: int) -> list[int]:
    """The agent and its lazy store daemon (not the agent's child to reap until it exits)."""
    from rollstack.node.recovery import daemon_pids

    return [agent_pid, *daemon_pids(Path(config.lazy_dir) / "mnt")]


def other_mode(base: Path, spec: str, plan: dict[str, Any], count: int, rounds: int, warm: int) -> dict[str, Any]:
    """The fan-out on a node of the other warm-pool setting than the run's (`--warm`)."""
    return on_node(base, spec, plan, count, rounds, 0 if warm else max(WARM_POOL, 2 * count))


def on_node(base: Path, spec: str, plan: dict[str, Any], count: int, rounds: int, pool: int) -> dict[str, Any]:
    """The fan-out on a node of its own with a warm pool of `pool` sandboxes (0: none)."""
    from rollstack_bench.node_common import _node
    from rollstack.client import Client
    from rollstack.node import agent

    extra = {"warm_pool": pool, "warm_pool_max": max(64, pool)} if pool else {}
    config, pid = _node(base, f"node-fanout-{pool}", spec, **extra)
    try:
        with Client(config.url(), token=config.token_path.read_text().strip()) as client:
            client.create(plan).destroy()
            return measure(client, plan, count, rounds, pool, node_pids(config, pid))
    finally:
        agent.stop(config)


def run_fanout_only(count: int, rounds: int, warm: int) -> dict[str, Any]:
    """`bench node --only-fanout`: the fan-out with the warm pool (`warm`, or WARM_POOL) and
    without, each on a node of its own, over the busybox corpus."""
    import shutil
    import tempfile

    from rollstack_bench.env import busybox_plan, publish_busybox_corpus
    from rollstack_bench.node_common import SMALL
    from rollstack_bench.report import current_command, machine_facts

    base = Path(tempfile.mkdtemp(prefix="rs-bench-fanout-", dir="/var/tmp"))
    try:
        spec = publish_busybox_corpus(base / "store", base / "build")
        plan = busybox_plan(resources=SMALL)
        modes = {"warm": on_node(base, spec, plan, count, rounds, warm or max(WARM_POOL, 2 * count)),
                 "cold": on_node(base, spec, plan, count, rounds, 0)}
        summary = {k: v for f in modes.values() for k, v in mode_summary(f).items()}
        return {"fanout": modes, "summary": summary, "machine": machine_facts(), "command": current_command()}
    finally:
        shutil.rmtree(base, ignore_errors=True)
