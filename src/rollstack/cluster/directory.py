"""`Directory`: a pool's live view of its nodes, and the request a plan places as.

- members come from a source (the Ray node actors, or a static list), re-read every
  `member_interval` s; each member's `GET /v1/node` report is polled every `interval` s in a
  background thread. A node that fails a poll (or a call) is marked dead at once: placement
  skips it from then on (within `interval` + `probe_timeout` of its death) until a poll answers;
- `views()` gives placement's `NodeView`s: the reports minus the creates in flight on each node
  (reserved here until they return), so a burst of creates does not all land on one node;
- `place()` decides on one `PlacementIndex` kept per view refresh (rebuilt only when a report,
  a member or a node's liveness changed, or a create failed); each decision is committed into
  it, so a create costs one decision, not an index build over every node;
- `lost(node_id, created_instance)` answers whether an environment created under that agent
  instance is gone with its node (unreachable, or restarted since): the pool's `node_lost`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from rollstack.cluster.placement import NodeView, PlacementIndex, PlacementPolicy, PlacementRequest, place

log = logging.getLogger(__name__)

Source = Callable[[], list[dict[str, Any]]]


@dataclass
class Member:
    node_id: str
    url: str
    token: str | None
    lazy_url: str | None = None
    info: dict[str, Any] | None = None
    alive: bool = False
    dead_since: float | None = None
    reserved: list[PlacementRequest] = field(default_factory=list)


class Directory:
    def __init__(self, source: Source, *, interval: float = 1.0, member_interval: float = 3.0,
                 probe_timeout: float = 1.0) -> None:
        self.source = source
        self.interval, self.member_interval, self.probe_timeout = interval, member_interval, probe_timeout
        self.members: dict[str, Member] = {}
        self.died_at: dict[str, float] = {}
        """node_id -> time.monotonic() it was last seen going from alive to dead (kept after it returns)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._http = httpx.Client(timeout=httpx.Timeout(probe_timeout))
        self._members_at = 0.0
        self._version = 0  # bumped whenever what views() would return changes beyond our own commits
        self._index: PlacementIndex | None = None
        self._index_key: tuple[int, PlacementPolicy] | None = None
        self.index_builds = 0
        self.refresh_members()
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="rollstack-directory", daemon=True)
        self._thread.start()

    # -- refresh ------------------------------------------------------------------------------
    def refresh_members(self) -> None:
        try:
            docs = self.source()
        except Exception as exc:  # noqa: BLE001 - keep the last known members
            log.warning("listing the pool's members failed: %s", exc)
            return
        self._members_at = time.monotonic()
        with self._lock:
            seen = set()
            for d in docs:
                if d.get("state", "running") not in ("running", "restarting"):
                    continue
                seen.add(d["node_id"])
                m = self.members.get(d["node_id"])
                if m is None or m.url != d["url"]:
                    self.members[d["node_id"]] = Member(d["node_id"], d["url"], d.get("token"), d.get("lazy_url"))
                    self._version += 1
            for gone in set(self.members) - seen:  # its actor is gone: so is the node
                m = self.members[gone]
                if m.alive or m.dead_since is None:
                    m.alive, m.dead_since = False, time.monotonic()
                    self._version += 1

    def probe(self, node_id: str) -> dict[str, Any] | None:
        """Poll one node now; its report, or None (then it is marked dead)."""
        with self._lock:
            m = self.members.get(node_id)
        if m is None:
            return None
        headers = {"Authorization": f"Bearer {m.token}"} if m.token else {}
        try:
            r = self._http.get(m.url + "/v1/node", headers=headers)
            info = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            info = None
        with self._lock:
            if info is None or info.get("status") != "ok":
                if m.alive or m.info is not None and m.dead_since is None:
                    self._version += 1
                if m.alive or m.dead_since is None:
                    m.dead_since = self.died_at[node_id] = time.monotonic()
                m.alive = False
            else:
                if m.info is not None and m.info.get("instance") != info.get("instance") and m.alive:
                    self.died_at[node_id] = time.monotonic()  # restarted between two polls
                if info != m.info or not m.alive:
                    self._version += 1
                m.info, m.alive, m.dead_since = info, True, None
        return info

    def poll(self) -> None:
        with self._lock:
            ids = list(self.members)
        for node_id in ids:
            self.probe(node_id)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if time.monotonic() - self._members_at >= self.member_interval:
                self.refresh_members()
            self.poll()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._http.close()

    # -- queries ------------------------------------------------------------------------------
    def member(self, node_id: str) -> Member | None:
        with self._lock:
            return self.members.get(node_id)

    def mark_dead(self, node_id: str) -> None:
        with self._lock:
            m = self.members.get(node_id)
            if m is not None and m.alive:
                m.alive, m.dead_since = False, time.monotonic()
                self.died_at[node_id] = m.dead_since
                self._version += 1

    def instance(self, node_id: str) -> str | None:
        m = self.member(node_id)
        return (m.info or {}).get("instance") if m is not None else None

    def views(self) -> list[NodeView]:
        with self._lock:
            return [_view(m) for m in self.members.values() if m.info is not None]

    def place(self, req: PlacementRequest, policy: PlacementPolicy, exclude: frozenset[str],
              pool: str) -> tuple[str, float]:
        """(node_id, share of the stack's bytes hot there before the decision) for one env of `req`,
        decided on the index of the current view and committed into it. The caller `reserve`s the
        node for the create and `release`s it with the outcome."""
        with self._lock:
            if self._index is None or self._index_key != (self._version, policy):
                self._index = PlacementIndex([_view(m) for m in self.members.values() if m.info is not None], policy)
                self._index_key = (self._version, policy)
                self.index_builds += 1
            hot = self._index.hot_fraction(req.layers)  # an immutable array: the state before the commit
            node_id = place(req, self._index, policy, exclude=exclude, pool=pool)[0]
            return node_id, float(hot[self._index.pos[node_id]])

    def reserve(self, node_id: str, req: PlacementRequest) -> None:
        """The create is in flight: a rebuilt view still counts it (the kept index already does)."""
        with self._lock:
            self.members[node_id].reserved.append(req)

    def release(self, node_id: str, req: PlacementRequest, created: bool = True) -> None:
        """The create returned. A created env stays charged in the kept index until the next report
        counts it; a failed one drops the index (rebuilt from the reports on the next decision)."""
        with self._lock:
            m = self.members.get(node_id)
            if m is not None and req in m.reserved:
                m.reserved.remove(req)
            if not created:
                self._version += 1

    def lost(self, node_id: str, created_instance: str | None) -> bool:
        """Is an environment created under `created_instance` gone with its node?"""
        info = self.probe(node_id)
        if info is None:
            return True
        return created_instance is not None and info.get("instance") != created_instance


def _view(m: Member) -> NodeView:
    info = m.info or {}
    free = info.get("free", {})
    cpu, mem, slots = float(free.get("cpu", 0.0)), int(free.get("memory", 0)), int(free.get("slots", 0))
    groups = dict(info.get("groups", {}))
    hot = set(info.get("hot_layers", []))
    for r in m.reserved:
        cpu, mem, slots = cpu - r.cpu, mem - r.memory, slots - 1
        if r.trace_key:
            groups[r.trace_key] = groups.get(r.trace_key, 0) + 1
        hot.update(d for d, _ in r.layers)
    return NodeView(node_id=m.node_id, url=m.url, alive=m.alive, free_cpu=max(cpu, 0.0), free_memory=max(mem, 0),
                    free_slots=max(slots, 0), hot_layers=frozenset(hot), groups=groups)


class Placer:
    """Plan (wire dict) -> `PlacementRequest`: its stack resolved against the cluster's store
    (cached like a node's resolver), its trace key the one the node will record under."""

    def __init__(self, store_spec: str | None) -> None:
        self.store_spec = store_spec
        self._resolver: Any = None
        self._lock = threading.Lock()

    def _get_resolver(self) -> Any:
        with self._lock:
            if self._resolver is None and self.store_spec:
                from rollstack.plan.resolve import Resolver
                from rollstack.store import open_store

                self._resolver = Resolver(open_store(self.store_spec), None, ttl=60.0)
            return self._resolver

    def request(self, wire: dict[str, Any]) -> PlacementRequest:
        from rollstack.plan.model import load_plan

        return self.request_plan(load_plan(wire))

    def request_template(self, name_tag: str) -> PlacementRequest:
        """The request of a published plan (an E2B template id), read from the cluster's store
        (TemplateNotFound when there is none; without a store: the node will answer)."""
        from rollstack.errors import TemplateNotFound
        from rollstack.plan.published import load_published

        resolver = self._get_resolver()
        if resolver is None:
            raise TemplateNotFound(f"no store to look up template {name_tag!r} in")
        return self.request_plan(load_published(resolver.store, name_tag))

    def request_plan(self, plan: Any) -> PlacementRequest:
        from rollstack.fetch.traces import trace_keys

        resolver = self._get_resolver()
        layers: tuple[tuple[str, int], ...] = ()
        key = None
        if resolver is not None:
            stack = resolver.resolve(plan)
            layers = tuple((r.digest, int(r.size)) for r in stack.layers)
            key, _ = trace_keys(stack.stack_digest, plan)
        return PlacementRequest(layers=layers, trace_key=key, cpu=float(plan.resources.cpu),
                                memory=int(plan.resources.memory))
