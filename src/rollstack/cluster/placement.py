"""Cache-aware GRPO placement: which node gets each new environment (pure; no I/O, no Ray).

CONTRACT (the pool and the simulator code against this):

    place(request, nodes, policy=PlacementPolicy(), exclude=frozenset()) -> list[str]

returns a node_id for each of `request.count` environments, in order; capacity is consumed across
the batch; raises `InsufficientCapacity` (details: pool, needed, placed) naming the pool when the
pool cannot admit them all (nothing is placed then). `nodes` is a sequence of `NodeView`s or a
`PlacementIndex` built from them (the live view keeps one index per refresh and `commit`s each
decision into it, so a decision never walks node objects or layer sets in Python).

Scoring, for every node that is alive, not excluded and can admit the request (a free slot, the
cores and the memory after the node's admission reserve):

    score = hot_weight  * (bytes of the stack already hot there / bytes of the stack)
          + load_weight * (free fraction of its scarcest resource: slots, cores, memory, minus
                           the room reserved for the groups already there; may go below 0)

in three tiers (below); outside tier 1 only the nodes whose free fraction is within `load_band`
(default 0.0625, i.e. 4 slots of a 64-slot node) of the emptiest candidate's compete, so hot
layers decide among nodes of comparable load but never pile new tasks onto one node while others
idle (without the band a hot stack is worth `hot_weight/load_weight` = half a node of load). The
tiers: the nodes holding 1..spread_limit-1 live envs of the request's trace key come
first; then the nodes without it (those with room for this env, or for a new group's
spread_limit envs, beyond what they reserved for their groups first); the nodes holding
>= spread_limit of it only when nothing else fits. So a GRPO group stays on one node until that node is full or holds `spread_limit` of it,
and the rollouts after the first find its access trace and its layers there. A group on a node
reserves room for its remaining members (spread_limit - count envs of its size): the reservation
lowers the node's load term for everyone else (new groups go elsewhere before the node is full of
first rollouts, so each group's later rollouts still fit) but never refuses an env. Within a
tier the highest score wins; ties go to the smallest node_id (nodes are kept sorted), so the same
view and request always give the same answer. After
a decision the index charges the node (cores, memory, one slot), counts the group there, and
marks the stack's layers hot there (the node is about to fetch them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rollstack.errors import InsufficientCapacity, InvalidRequest


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
    group_reserve: bool = True  # a group's first env reserves room for the rest (load term only)
    hot_weight: float = 1.0  # weight of the hot-bytes fraction
    load_weight: float = 2.0  # weight of the free fraction of the scarcest resource (see docs/cluster-placement.md)
    load_band: float | None = 0.0625  # outside a group, only nodes within this free fraction of the emptiest compete


def check_request(request: PlacementRequest, policy: PlacementPolicy) -> None:
    if request.count < 1:
        raise InvalidRequest(f"placement count must be >= 1, got {request.count}")
    if request.cpu < 0 or request.memory < 0:
        raise InvalidRequest(f"placement asks for negative resources (cpu={request.cpu}, memory={request.memory})")
    if any(size < 0 for _, size in request.layers):
        raise InvalidRequest("placement request has a layer with a negative size")
    check_policy(policy)


def check_policy(policy: PlacementPolicy) -> None:
    if policy.hot_weight < 0 or policy.load_weight < 0:
        raise InvalidRequest("placement weights must be >= 0")
    if policy.spread_limit < 1:
        raise InvalidRequest(f"spread_limit must be >= 1, got {policy.spread_limit}")
    if policy.load_band is not None and not policy.load_band >= 0:
        raise InvalidRequest(f"load_band must be >= 0 or None, got {policy.load_band}")


class PlacementIndex:
    """The nodes of one view as arrays (position = rank of node_id). Change it only through
    `commit`, `release` and `forget_layer` (they keep the derived arrays current)."""

    def __init__(self, nodes: Iterable[NodeView], policy: PlacementPolicy = PlacementPolicy()) -> None:
        check_policy(policy)
        ordered = sorted(nodes, key=lambda n: n.node_id)
        self.ids: list[str] = [n.node_id for n in ordered]
        if len(set(self.ids)) != len(self.ids):
            raise InvalidRequest("placement view lists a node_id twice")
        self.pos: dict[str, int] = {nid: i for i, nid in enumerate(self.ids)}
        self.urls: dict[str, str] = {n.node_id: n.url for n in ordered}
        self.alive = np.array([n.alive for n in ordered], dtype=bool)
        self.cpu = np.array([n.free_cpu for n in ordered], dtype=np.float64)
        self.mem = np.array([n.free_memory for n in ordered], dtype=np.float64)
        self.slots = np.array([n.free_slots for n in ordered], dtype=np.float64)
        # Fixed scales (the view's largest free figures) turn free amounts into fractions.
        self._scale = tuple(float(max(a.max(initial=0.0), 1e-9)) for a in (self.slots, self.cpu, self.mem))
        # Room reserved for the members still to come of the groups on each node (slots, cpu, mem).
        self.limit = policy.spread_limit
        self.res = np.zeros((3, len(ordered)), dtype=np.float64)
        holders: dict[str, list[int]] = {}
        self.groups: dict[str, dict[int, int]] = {}
        for i, n in enumerate(ordered):
            for digest in n.hot_layers:
                holders.setdefault(digest, []).append(i)
            for key, c in n.groups.items():
                if c > 0:
                    self.groups.setdefault(key, {})[i] = int(c)
                    self.res[0, i] += self._reserve(int(c))  # sizes unknown from a view: slots only
        self.hot: dict[str, np.ndarray] = {}
        for digest, where in holders.items():
            mask = np.zeros(len(ordered), dtype=bool)
            mask[where] = True
            self.hot[digest] = mask
        # Derived per-node arrays, kept current by `_touch(i)` after every change to node i, so a
        # decision does not recompute them: admissible at all, free fraction (raw, after
        # reservations), room after reservations. Hot fractions are cached per stack until a
        # hot bit flips anywhere.
        self._open = self.alive & (self.slots >= 1)
        s, c, m = self._scale
        self._frac = np.minimum(np.minimum(self.slots / s, self.cpu / c), self.mem / m)
        self._room = np.stack([self.slots - self.res[0], self.cpu - self.res[1], self.mem - self.res[2]])
        self._frac_res = np.minimum(np.minimum(self._room[0] / s, self._room[1] / c), self._room[2] / m)
        self._hot_version = 0
        self._hot_cache: dict[tuple[tuple[str, int], ...], tuple[int, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    # --- the terms of the score, as arrays over nodes ---

    def _touch(self, i: int) -> None:
        s, c, m = self._scale
        self._open[i] = self.alive[i] and self.slots[i] >= 1
        self._frac[i] = min(self.slots[i] / s, self.cpu[i] / c, self.mem[i] / m)
        room = self._room[:, i] = (self.slots[i] - self.res[0, i], self.cpu[i] - self.res[1, i], self.mem[i] - self.res[2, i])
        self._frac_res[i] = min(room[0] / s, room[1] / c, room[2] / m)

    def feasible(self, request: PlacementRequest, excluded: np.ndarray | None = None) -> np.ndarray:
        ok = self._open & (self.cpu >= request.cpu) & (self.mem >= request.memory)
        if excluded is not None:
            ok &= ~excluded
        return ok

    def _reserve(self, count: int) -> int:
        return max(0, self.limit - count) if count >= 1 else 0

    def free_fraction(self, reserved: bool = False) -> np.ndarray:
        """Free fraction of each node's scarcest resource; `reserved` subtracts the room held for
        groups' remaining members (then it can be negative)."""
        return (self._frac_res if reserved else self._frac).copy()

    def hot_fraction(self, layers: Sequence[tuple[str, int]]) -> np.ndarray:
        """Per node, the share of the stack's bytes hot there (read-only array)."""
        key = tuple(layers)
        hit = self._hot_cache.get(key)
        if hit is not None and hit[0] == self._hot_version:
            return hit[1]
        total = float(sum(size for _, size in layers))
        acc = np.zeros(len(self.ids), dtype=np.float64)
        if total > 0:
            for digest, size in layers:
                mask = self.hot.get(digest)
                if mask is not None and size:
                    acc += mask * (size / total)
        acc.flags.writeable = False
        if len(self._hot_cache) >= 4096:
            self._hot_cache.clear()
        self._hot_cache[key] = (self._hot_version, acc)
        return acc

    def hot_bytes(self, i: int, layers: Sequence[tuple[str, int]]) -> int:
        return sum(size for digest, size in layers if (m := self.hot.get(digest)) is not None and m[i])

    def exclusion(self, exclude: Iterable[str]) -> np.ndarray | None:
        where = [self.pos[nid] for nid in exclude if nid in self.pos]
        if not where:
            return None
        mask = np.zeros(len(self.ids), dtype=bool)
        mask[where] = True
        return mask

    # --- one decision, and its effect ---

    def choose(self, request: PlacementRequest, policy: PlacementPolicy,
               excluded: np.ndarray | None = None) -> int | None:
        """Position of the best node for one env of `request`, or None when none can admit it."""
        group = self.groups.get(request.trace_key) if request.trace_key is not None else None
        if group:  # tier 1: the group's nodes with room for it (a few nodes: scalar arithmetic)
            below = [i for i, c in group.items() if c < policy.spread_limit and self._admits(i, request, excluded)]
            if below:
                return min(below, key=lambda i: (-self._score_one(i, request, policy), i))
        ok = self.feasible(request, excluded)
        if not ok.any():
            return None
        score = policy.load_weight * (self._frac_res if policy.group_reserve else self._frac)
        if policy.hot_weight:
            score += policy.hot_weight * self.hot_fraction(request.layers)
        if group:
            over = [i for i in group if ok[i]]
            if len(over) < int(ok.sum()):  # tier 3 (nodes at the spread limit) only when nothing else fits
                ok = ok.copy()
                ok[over] = False
        if policy.group_reserve:  # within tier 2, nodes with room beyond their reservations first
            need = policy.spread_limit if request.trace_key is not None else 1
            room = self._room
            roomy = ok & (room[0] >= need) & (room[1] >= need * request.cpu) & (room[2] >= need * request.memory)
            if roomy.any():
                ok = roomy
        free = self._frac_res if policy.group_reserve else self._frac
        if policy.load_band is not None:  # comparable load only: hot layers never outweigh a real load gap
            ok = ok & (free >= float(free[ok].max()) - policy.load_band - 1e-12)
        score[~ok] = -np.inf
        return int(np.argmax(score))

    def _admits(self, i: int, request: PlacementRequest, excluded: np.ndarray | None) -> bool:
        return bool(self.alive[i] and self.slots[i] >= 1 and self.cpu[i] >= request.cpu
                    and self.mem[i] >= request.memory and (excluded is None or not excluded[i]))

    def _score_one(self, i: int, request: PlacementRequest, policy: PlacementPolicy) -> float:
        """The vector score of `choose` for one node."""
        s, c, m = self._scale
        free = self._frac_res[i] if policy.group_reserve else self._frac[i]
        total = sum(size for _, size in request.layers)
        hot = self.hot_bytes(i, request.layers) / total if total > 0 else 0.0
        return policy.load_weight * float(free) + policy.hot_weight * hot

    def commit(self, i: int, request: PlacementRequest) -> list[str]:
        """Charge node `i` with one env of `request` (capacity, group, layers about to be hot);
        returns the digests that became hot there (for `release(..., unmark=)`)."""
        self.cpu[i] -= request.cpu
        self.mem[i] -= request.memory
        self.slots[i] -= 1
        if request.trace_key is not None:
            g = self.groups.setdefault(request.trace_key, {})
            c = g.get(i, 0)
            g[i] = c + 1
            self._shift(i, self._reserve(c + 1) - self._reserve(c), request)
        fresh = []
        for digest, _ in request.layers:
            mask = self.hot.get(digest)
            if mask is None:
                mask = self.hot[digest] = np.zeros(len(self.ids), dtype=bool)
            if not mask[i]:
                mask[i] = True
                fresh.append(digest)
        if fresh:
            self._hot_version += 1
        self._touch(i)
        return fresh

    def release(self, i: int, request: PlacementRequest, unmark: Iterable[str] = ()) -> None:
        """Give back what `commit` charged (the env was destroyed); its layers stay hot except
        `unmark` (a decision taken back before the node fetched anything)."""
        for digest in unmark:
            self.forget_layer(i, digest)
        self.cpu[i] += request.cpu
        self.mem[i] += request.memory
        self.slots[i] += 1
        if request.trace_key is not None:
            g = self.groups.get(request.trace_key, {})
            c = g.get(i, 0)
            if c >= 1:
                self._shift(i, self._reserve(c - 1) - self._reserve(c), request)
            if c <= 1:
                g.pop(i, None)
                if not g:
                    self.groups.pop(request.trace_key, None)
            else:
                g[i] -= 1
        self._touch(i)

    def _shift(self, i: int, delta: int, request: PlacementRequest) -> None:
        if delta:  # (a group known from a view reserved slots only: never go below 0)
            self.res[0, i] = max(0.0, self.res[0, i] + delta)
            self.res[1, i] = max(0.0, self.res[1, i] + delta * request.cpu)
            self.res[2, i] = max(0.0, self.res[2, i] + delta * request.memory)

    def forget_layer(self, i: int, digest: str) -> None:
        """The node evicted `digest` from its cache."""
        mask = self.hot.get(digest)
        if mask is not None and mask[i]:
            mask[i] = False
            self._hot_version += 1


def place(request: PlacementRequest, nodes: Sequence[NodeView] | PlacementIndex,
          policy: PlacementPolicy = PlacementPolicy(), exclude: frozenset[str] = frozenset(),
          pool: str = "pool") -> list[str]:
    """node_id for each of `request.count` envs. A `PlacementIndex` passed in is updated in
    place when the whole batch fits (and left untouched when it does not)."""
    check_request(request, policy)
    index = nodes if isinstance(nodes, PlacementIndex) else PlacementIndex(nodes, policy)
    if index.limit != policy.spread_limit:
        raise InvalidRequest(f"the placement index reserves for spread_limit {index.limit}, "
                             f"the policy asks for {policy.spread_limit}: build the index with the policy")
    excluded = index.exclusion(exclude)
    chosen: list[int] = []
    marked: list[list[str]] = []
    for _ in range(request.count):
        i = index.choose(request, policy, excluded)
        if i is None:
            for j, fresh in zip(reversed(chosen), reversed(marked)):
                index.release(j, request, unmark=fresh)
            raise InsufficientCapacity(
                f"{pool}: no node can admit {request.count} environment(s) of {request.cpu:g} cpu / "
                f"{request.memory} bytes ({len(chosen)} fit; {int(index.alive.sum())} of {len(index)} nodes alive, "
                f"{len(exclude)} excluded)", pool=pool, needed=request.count, placed=len(chosen))
        marked.append(index.commit(i, request))
        chosen.append(i)
    return [index.ids[i] for i in chosen]
