"""The placement strategies compared side by side (the simulator and `bench cluster-sim` run all).

Each strategy answers `choose(index, request, excluded) -> position | None` on the same
`PlacementIndex` (same feasibility rule: alive, not excluded, a free slot, the cores and the
memory); only the choice among feasible nodes differs:

- `cache-aware`: rollstack's score (`placement.PlacementIndex.choose`).
- `round-robin`: the next feasible node after the last one used (AgentENV-style dispatch).
- `least-loaded`: the feasible node with the largest free fraction of its scarcest resource.
- `best-of-k`: sample K feasible nodes uniformly, take the least loaded of them (E2B-style
  power-of-K choices; K=3 by default, seeded, so a run is reproducible).

None of the baselines looks at layers or trace keys.
"""

from __future__ import annotations

import random

import numpy as np

from rollstack.cluster.placement import PlacementIndex, PlacementPolicy, PlacementRequest, place
from rollstack.errors import InsufficientCapacity, InvalidRequest


class CacheAware:
    name = "cache-aware"

    def __init__(self, policy: PlacementPolicy = PlacementPolicy()) -> None:
        self.policy = policy

    def choose(self, index: PlacementIndex, request: PlacementRequest, excluded: np.ndarray | None = None) -> int | None:
        return index.choose(request, self.policy, excluded)


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self.cursor = -1

    def choose(self, index: PlacementIndex, request: PlacementRequest, excluded: np.ndarray | None = None) -> int | None:
        ok = np.flatnonzero(index.feasible(request, excluded))
        if not ok.size:
            return None
        k = int(np.searchsorted(ok, self.cursor, side="right"))
        self.cursor = int(ok[k % ok.size])
        return self.cursor


class LeastLoaded:
    name = "least-loaded"

    def choose(self, index: PlacementIndex, request: PlacementRequest, excluded: np.ndarray | None = None) -> int | None:
        ok = index.feasible(request, excluded)
        if not ok.any():
            return None
        score = index.free_fraction()
        score[~ok] = -np.inf
        return int(np.argmax(score))


class BestOfK:
    name = "best-of-k"

    def __init__(self, k: int = 3, seed: int = 0) -> None:
        if k < 1:
            raise InvalidRequest(f"best-of-k needs k >= 1, got {k}")
        self.k = k
        self.rng = random.Random(seed)

    def choose(self, index: PlacementIndex, request: PlacementRequest, excluded: np.ndarray | None = None) -> int | None:
        ok = np.flatnonzero(index.feasible(request, excluded))
        if not ok.size:
            return None
        picks = sorted(int(ok[j]) for j in self.rng.sample(range(ok.size), min(self.k, ok.size)))
        free = index.free_fraction()
        return max(picks, key=lambda i: (free[i], -i))


STRATEGIES = ("cache-aware", "round-robin", "least-loaded", "best-of-k")


def make(name: str, policy: PlacementPolicy = PlacementPolicy(), k: int = 3, seed: int = 0):
    if name == "cache-aware":
        return CacheAware(policy)
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "best-of-k":
        return BestOfK(k, seed)
    raise InvalidRequest(f"unknown placement strategy {name!r} (known: {', '.join(STRATEGIES)})")


def place_with(strategy, request: PlacementRequest, index: PlacementIndex,
               exclude: frozenset[str] = frozenset(), pool: str = "pool") -> list[str]:
    """`place` for any strategy (the cache-aware one goes through `placement.place` itself)."""
    if isinstance(strategy, CacheAware):
        return place(request, index, strategy.policy, exclude, pool)
    excluded = index.exclusion(exclude)
    chosen: list[tuple[int, list[str]]] = []
    for _ in range(request.count):
        i = strategy.choose(index, request, excluded)
        if i is None:
            for j, fresh in reversed(chosen):
                index.release(j, request, unmark=fresh)
            raise InsufficientCapacity(f"{pool}: no node can admit {request.count} environment(s)",
                                       pool=pool, needed=request.count, placed=len(chosen))
        chosen.append((i, index.commit(i, request)))
    return [index.ids[i] for i, _ in chosen]
