"""Cache-aware GRPO placement: which node gets each new environment (pure; no I/O, no Ray).

CONTRACT (the pool and the simulator code against this):

    place(request, nodes, policy=PlacementPolicy(), exclude=frozenset()) -> list[str]

returns a node_id for each of `request.count` environments, in order; capacity is consumed
across the batch; raises `InsufficientCapacity` (details: pool, needed, placed) when the pool
cannot admit them all (nothing is placed then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rollstack.errors import InsufficientCapacity


@dataclass(frozen=True)
class NodeView:
    """What the pool knows about one node (from its last report)."""

    node_id: str
    url: str
    alive: bool
    free_cpu: float  # cores still admissible (after the admission reserve)
    free_memory: int  # bytes still admissible
    free_slots: int  # environments it can still admit
    hot_layers: frozenset[str] = frozenset()  # layer digests materialized or in the node cache
    groups: Mapping[str, int] = field(default_factory=dict)  # trace_key -> live envs of that task there


@dataclass(frozen=True)
class PlacementRequest:
    layers: tuple[tuple[str, int], ...]  # (digest, size), bottom first
    trace_key: str | None  # the GRPO group / task key
    cpu: float
    memory: int
    count: int = 1


@dataclass(frozen=True)
class PlacementPolicy:
    spread_limit: int = 8  # max envs of one trace_key per node before spreading


def place(request: PlacementRequest, nodes: Sequence[NodeView], policy: PlacementPolicy = PlacementPolicy(),
          exclude: frozenset[str] = frozenset(), pool: str = "pool") -> list[str]:
    """Placeholder (contract only); the scored implementation replaces it."""
    free = {n.node_id: [n.free_cpu, n.free_memory, n.free_slots] for n in nodes
            if n.alive and n.node_id not in exclude}
    out: list[str] = []
    for _ in range(request.count):
        for nid in sorted(free):
            f = free[nid]
            if f[0] >= request.cpu and f[1] >= request.memory and f[2] >= 1:
                f[0] -= request.cpu
                f[1] -= request.memory
                f[2] -= 1
                out.append(nid)
                break
        else:
            raise InsufficientCapacity(f"{pool}: no node can admit {request.count} environment(s)",
                                       pool=pool, needed=request.count, placed=len(out))
    return out
