"""A cluster simulator for placement: GRPO iterations on N modelled nodes, one strategy at a time.

Pure (no I/O, no clock but the timing of the placement calls themselves). The real placement code
(`placement.PlacementIndex` + a strategy from `placement_baselines`) decides; the simulator plays
the consequences on per-node cost figures (`Costs`, defaults measured on this machine, see
`rollstack_bench.cluster_sim`).

Model, per iteration:
- The trainer asks for `envs` environments at t=0: `envs / group_size` tasks sampled from a task
  universe (each task uses os + one repository layer (Zipf popularity) + harness), `group_size`
  rollouts per task (trace key = task), in `grouped` (task by task) or `interleaved` (rollout 1
  of every task, then rollout 2, ...) order. One placement decision per environment.
- Placement sees the pool as a `PlacementIndex` built at the start of the iteration from the
  nodes' caches (their hot layers), then updated by each decision (capacity, group, layers).
- A node creates `concurrency` environments at once, in arrival order. An environment reads
  `read_fraction` of each of its layers (the chunks every task of that stack reads) plus
  `task_bytes` of its own task (the files the task's access trace names). What the node does not
  hold yet is fetched from the registry over the node's link (one FIFO link per node, shared by
  that node's fetches; a chunk set fetched once serves every later env on the node). An env is
  ready at max(start + create cost, arrival of its bytes); create costs `cold_create_s` instead of
  `create_s` when a layer of its stack was not on the node yet.
- With `peers`, a miss that another node's cache holds is served by that node (counted as peer
  bytes, at the same link rate, ignoring when within the iteration the holder got it); only the
  first fetch of a chunk set in the pool reaches the registry.
- At the end of the iteration the environments are destroyed; the node caches keep what they
  fetched (LRU-evicted beyond `cache_bytes`), so the next iteration starts from those caches.

Reported per strategy: hot-layer hit ratio (bytes of the stack already hot on the chosen node at
decision time / stack bytes), GRPO co-location (share of rollouts 2..N that joined a node already
holding an earlier rollout of their task), registry egress, init p50/p95, placement throughput.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rollstack.cluster.placement import NodeView, PlacementIndex, PlacementPolicy, PlacementRequest, check_policy
from rollstack_bench.placement_baselines import make
from rollstack.errors import InvalidRequest

MB = 1_000_000


@dataclass(frozen=True)
class Costs:
    create_s: float = 0.10  # warm create (stack's layers on the node)
    cold_create_s: float = 0.28  # create when a layer of the stack is new to the node
    link_bytes_per_s: float = 0.9e9 / 8  # node <-> registry
    rollout_s: float = 7.2  # one rollout after init (agent + tests), for the iteration makespan
    concurrency: int = 4  # creates in flight per node


@dataclass(frozen=True)
class Workload:
    nodes: int = 200
    envs: int = 10_000  # per iteration
    group_size: int = 8  # rollouts per task (GRPO group)
    iterations: int = 3
    repos: int = 40
    tasks: int = 5_000  # task universe the iterations sample from
    zipf: float = 1.1  # repository popularity
    os_bytes: int = 112 * MB
    harness_bytes: int = 239 * MB
    repo_bytes: int = 100 * MB
    read_fraction: float = 0.05
    task_bytes: int = 3 * MB
    slots: int = 0  # per node; 0 = ceil(1.25 * envs / nodes)
    env_cpu: float = 1.0
    env_memory: int = 2 << 30
    cache_bytes: int = 50_000 * MB  # per node chunk cache
    order: str = "interleaved"  # or "grouped"
    peers: bool = False  # a miss another node holds comes from that node, not the registry
    seed: int = 0

    def node_slots(self) -> int:
        return self.slots or math.ceil(1.25 * self.envs / self.nodes)

    def check(self) -> None:
        if self.nodes < 1 or self.envs < 1 or self.group_size < 1 or self.iterations < 1:
            raise InvalidRequest("nodes, envs, group_size and iterations must be >= 1")
        if self.repos < 1 or self.tasks < 1:
            raise InvalidRequest("repos and tasks must be >= 1")
        if not 0 <= self.read_fraction <= 1:
            raise InvalidRequest(f"read_fraction must be in [0, 1], got {self.read_fraction}")
        if self.order not in ("grouped", "interleaved"):
            raise InvalidRequest(f"order must be grouped or interleaved, got {self.order!r}")


@dataclass
class _Node:
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)  # chunk set -> bytes, LRU order
    held: int = 0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _stacks(w: Workload) -> tuple[list[tuple[tuple[str, int], ...]], list[int]]:
    """Per repository, its stack's layers; per task of the universe, its repository."""
    rng = random.Random(f"universe-{w.seed}")
    stacks = [(("sha256:os", w.os_bytes), (f"sha256:repo-{r:03d}", w.repo_bytes), ("sha256:harness", w.harness_bytes))
              for r in range(w.repos)]
    weights = [1 / (r + 1) ** w.zipf for r in range(w.repos)]
    task_repo = rng.choices(range(w.repos), weights=weights, k=w.tasks)
    return stacks, task_repo


def _arrivals(w: Workload, rng: random.Random) -> list[tuple[int, int]]:
    """(task, rollout) in request order for one iteration."""
    n_tasks = math.ceil(w.envs / w.group_size)
    tasks = rng.sample(range(w.tasks), n_tasks) if n_tasks <= w.tasks else [rng.randrange(w.tasks) for _ in range(n_tasks)]
    pairs = [(t, r) for t in tasks for r in range(w.group_size)]
    if w.order == "interleaved":
        pairs.sort(key=lambda p: p[1])  # stable: rollout 0 of every task, then rollout 1, ...
    return pairs[:w.envs]


def simulate(strategy: str, w: Workload = Workload(), costs: Costs = Costs(),
             policy: PlacementPolicy = PlacementPolicy(), k: int = 3) -> dict[str, Any]:
    w.check()
    check_policy(policy)
    if costs.concurrency < 1 or costs.link_bytes_per_s <= 0:
        raise InvalidRequest("costs need concurrency >= 1 and a link rate > 0")
    chooser = make(strategy, policy, k=k, seed=w.seed)
    stacks, task_repo = _stacks(w)
    rng = random.Random(f"arrivals-{w.seed}")
    slots = w.node_slots()
    nodes = [_Node() for _ in range(w.nodes)]
    holders: dict[str, int] = {}  # chunk set -> how many node caches hold it
    ids = [f"node-{i:04d}" for i in range(w.nodes)]
    iterations = []
    for it in range(w.iterations):
        views = [NodeView(ids[i], f"sim://{ids[i]}", True, slots * w.env_cpu, slots * w.env_memory, slots,
                          frozenset(c for c in nodes[i].cache if c.startswith("sha256:")), {})
                 for i in range(w.nodes)]
        index = PlacementIndex(views, policy)
        assert index.ids == ids  # zero-padded ids: index position == simulated node number
        placed: list[tuple[int, int]] = []  # (node, task)
        hot_bytes = stack_bytes = 0
        rejected = 0
        spent = 0.0
        for task, _ in _arrivals(w, rng):
            layers = stacks[task_repo[task]]
            req = PlacementRequest(layers, f"task-{task}", w.env_cpu, w.env_memory)
            t0 = time.perf_counter()
            i = chooser.choose(index, req)
            spent += time.perf_counter() - t0
            if i is None:
                rejected += 1
                continue
            hot_bytes += index.hot_bytes(i, layers)  # what was hot there before this decision
            stack_bytes += sum(s for _, s in layers)
            t0 = time.perf_counter()
            index.commit(i, req)
            spent += time.perf_counter() - t0
            placed.append((i, task))
        iterations.append(_play(w, costs, nodes, holders, stacks, task_repo, placed, hot_bytes, stack_bytes,
                                rejected, spent))
    return _summary(strategy, w, iterations)


def _play(w: Workload, costs: Costs, nodes: list[_Node], holders: dict[str, int], stacks, task_repo, placed,
          hot_bytes, stack_bytes, rejected, spent) -> dict[str, Any]:
    """Run the placed environments on the modelled nodes; update their caches."""
    by_node: dict[int, list[int]] = {}
    for i, task in placed:
        by_node.setdefault(i, []).append(task)
    inits: list[float] = []
    egress = peer = 0
    for i, tasks in by_node.items():
        node = nodes[i]
        workers = [0.0] * max(1, costs.concurrency)
        link_free = 0.0
        avail: dict[str, float] = {}  # chunk set -> time it is on the node this iteration
        for task in tasks:
            start = heapq.heappop(workers)
            layers = stacks[task_repo[task]]
            need = [(d, int(s * w.read_fraction)) for d, s in layers] + [(f"task-{task}", w.task_bytes)]
            cold = any(d not in node.cache and d not in avail for d, _ in layers)
            bytes_at = start
            for key, size in need:
                if key in avail:
                    t = avail[key]
                elif key in node.cache:
                    node.cache.move_to_end(key)
                    t = avail[key] = 0.0
                else:
                    link_free = t = max(start, link_free) + size / costs.link_bytes_per_s
                    avail[key] = t
                    if w.peers and holders.get(key, 0) > 0:
                        peer += size  # (a peer link is modelled at the node's link rate)
                    else:
                        egress += size
                    node.cache[key] = size
                    node.held += size
                    holders[key] = holders.get(key, 0) + 1
                bytes_at = max(bytes_at, t)
            ready = max(start + (costs.cold_create_s if cold else costs.create_s), bytes_at)
            heapq.heappush(workers, ready)
            inits.append(ready)
        while node.held > w.cache_bytes and node.cache:
            key, size = node.cache.popitem(last=False)
            node.held -= size
            holders[key] -= 1
    groups: dict[int, set[int]] = {}
    sizes: dict[int, int] = {}
    for i, task in placed:
        groups.setdefault(task, set()).add(i)
        sizes[task] = sizes.get(task, 0) + 1
    joined = sum(sizes[t] - len(groups[t]) for t in groups)
    possible = sum(sizes[t] - 1 for t in groups)
    per_node = [len(v) for v in by_node.values()]
    return {
        "placed": len(placed), "rejected": rejected,
        "hot_hit_ratio": hot_bytes / stack_bytes if stack_bytes else 0.0,
        "grpo_colocation": joined / possible if possible else 1.0,
        "registry_egress_bytes": egress, "peer_bytes": peer,
        "init_p50_s": _pct(inits, 50), "init_p95_s": _pct(inits, 95), "init_max_s": max(inits, default=0.0),
        "makespan_s": max(inits, default=0.0) + costs.rollout_s,
        "nodes_used": len(by_node), "envs_per_node_max": max(per_node, default=0),
        "placement_s": spent, "decisions_per_s": (len(placed) + rejected) / spent if spent else 0.0,
    }


def _summary(strategy: str, w: Workload, iterations: list[dict[str, Any]]) -> dict[str, Any]:
    last = iterations[-1]
    total_egress = sum(x["registry_egress_bytes"] for x in iterations)
    decisions = sum(x["placed"] + x["rejected"] for x in iterations)
    spent = sum(x["placement_s"] for x in iterations)
    return {
        "strategy": strategy,
        "iterations": iterations,
        "warm": {k: last[k] for k in ("hot_hit_ratio", "grpo_colocation", "registry_egress_bytes",
                                      "init_p50_s", "init_p95_s", "makespan_s")},
        "registry_egress_bytes_total": total_egress,
        "peer_bytes_total": sum(x["peer_bytes"] for x in iterations),
        "decisions_per_s": decisions / spent if spent else 0.0,
        "rejected_total": sum(x["rejected"] for x in iterations),
    }
