"""Accounting of the data path: tiers, priorities, per-environment accounts, node metrics.

`FetchMetrics` owns the Prometheus collectors (in a registry of its own, so several daemons or
tests in one process never collide) plus plain counters for the JSON `stats()` answer.
`Account` is what one environment's reads add up to.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Tier(str, enum.Enum):
    MEMORY = "memory"
    DISK = "disk"
    PEER = "peer"
    REGISTRY = "registry"


class Priority(enum.IntEnum):
    FOREGROUND = 0  # a read is blocked on it
    PREFETCH = 1  # trace prefetch / sequential readahead: soon needed, parallel
    BACKGROUND = 2  # background fill: only when foreground is idle


NETWORK_TIERS = (Tier.PEER, Tier.REGISTRY)


@dataclass
class Account:
    """What one environment cost the data path.

    `read_bytes`: decompressed bytes its demand reads got, by the tier that served them.
    `transfers`: stored bytes moved over the network on its behalf, by "<tier>.<priority>"
    (foreground = a read of this environment was blocked on the request, neighbours included).
    """

    read_bytes: dict[str, int] = field(default_factory=lambda: {t.value: 0 for t in Tier})
    transfers: dict[str, int] = field(default_factory=dict)
    reads: int = 0
    stall_seconds: float = 0.0

    def record_read(self, tier: Tier, nbytes: int, stall: float) -> None:
        self.read_bytes[tier.value] += nbytes
        self.reads += 1
        if tier in NETWORK_TIERS:
            self.stall_seconds += stall

    def record_transfer(self, tier: Tier, priority: Priority, nbytes: int) -> None:
        key = f"{tier.value}.{priority.name.lower()}"
        self.transfers[key] = self.transfers.get(key, 0) + nbytes

    def _sum(self, prefix: str = "", suffix: str = "") -> int:
        return sum(v for k, v in self.transfers.items() if k.startswith(prefix) and k.endswith(suffix))

    def summary(self) -> dict[str, Any]:
        rb = self.read_bytes
        return {
            "fetched_bytes": self._sum(prefix="registry."),
            "from_cache_bytes": rb["memory"] + rb["disk"],
            "from_peer_bytes": self._sum(prefix="peer."),
            "stall_seconds": round(self.stall_seconds, 6),
            "critical_path_bytes": self._sum(suffix=".foreground"),
            "prefetch_bytes": self._sum(suffix=".prefetch"),
            "background_bytes": self._sum(suffix=".background"),
            "read_bytes": dict(rb),
            "transfers": dict(self.transfers),
            "reads": self.reads,
        }


_MAX_TRACKED = 500_000  # chunk digests remembered for the fetched-more-than-once check
_LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class FetchMetrics:
    """Node-wide counters (Prometheus + a JSON snapshot) and the recent event log."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.served_bytes = Counter("rollstack_fetch_served_bytes", "Demand-read bytes by serving tier", ["tier"], registry=r)
        self.served_hits = Counter("rollstack_fetch_served_chunks", "Demand chunk reads by serving tier", ["tier"], registry=r)
        self.latency = Histogram("rollstack_fetch_latency_seconds", "Chunk read latency by tier", ["tier"], buckets=_LATENCY_BUCKETS, registry=r)
        self.transferred = Counter("rollstack_fetch_transferred_bytes", "Bytes moved over the network by tier and priority", ["tier", "priority"], registry=r)
        self.requests = Counter("rollstack_fetch_requests", "Network requests by tier", ["tier"], registry=r)
        self.inflight = Gauge("rollstack_fetch_inflight", "Chunk fetches in flight", registry=r)
        self.stall = Counter("rollstack_fetch_stall_seconds", "Seconds reads waited on peers/registry", registry=r)
        self.integrity_errors = Counter("rollstack_integrity_errors", "Chunks whose bytes did not match their digest", registry=r)
        self.cache_bytes = Gauge("rollstack_cache_bytes", "Bytes held by a cache tier", ["tier"], registry=r)
        self._lock = threading.Lock()
        self._c: dict[str, float] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=200)
        self.fetch_counts: dict[str, int] = {}  # chunk digest -> registry fetches (single-flight check)
        self._children: dict[Tier, tuple] = {}
        self._served_keys = {t: (f"served_bytes.{t.value}", f"served_chunks.{t.value}") for t in Tier}

    def _add(self, key: str, v: float) -> None:
        with self._lock:
            self._c[key] = self._c.get(key, 0) + v

    def served(self, tier: Tier, nbytes: int, seconds: float) -> None:
        # the hot path of every read: label children resolved once, plain dict updates
        children = self._children.get(tier)
        if children is None:
            children = self._children[tier] = (self.served_bytes.labels(tier.value), self.served_hits.labels(tier.value),
                                               self.latency.labels(tier.value))
        children[0].inc(nbytes)
        children[1].inc()
        children[2].observe(seconds)
        c = self._c
        kb, kc = self._served_keys[tier]
        c[kb] = c.get(kb, 0) + nbytes  # single trio thread writes these: no lock needed
        c[kc] = c.get(kc, 0) + 1
        if tier in NETWORK_TIERS:
            self.stall.inc(seconds)
            self._add("stall_seconds", seconds)

    def transferred_bytes(self, tier: Tier, priority: Priority, nbytes: int, digests: list[str]) -> None:
        self.transferred.labels(tier.value, priority.name.lower()).inc(nbytes)
        self.requests.labels(tier.value).inc()
        self._add(f"transferred_bytes.{tier.value}", nbytes)
        self._add(f"transferred_bytes.{priority.name.lower()}", nbytes)
        self._add(f"requests.{tier.value}", 1)
        if tier is Tier.REGISTRY:
            with self._lock:
                if len(self.fetch_counts) > _MAX_TRACKED:  # a diagnostic, not state: keep it bounded
                    self.fetch_counts.clear()
                for d in digests:
                    self.fetch_counts[d] = self.fetch_counts.get(d, 0) + 1

    def event(self, kind: str, **details: Any) -> None:
        if kind == "integrity_error":
            self.integrity_errors.inc()
        self._add(f"events.{kind}", 1)
        self.events.append({"type": kind, "time": time.time(), **details})

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            c = dict(self._c)
            dup = sum(1 for n in self.fetch_counts.values() if n > 1)
            fetched = len(self.fetch_counts)
        served = {t.value: int(c.get(f"served_bytes.{t.value}", 0)) for t in Tier}
        chunks = {t.value: int(c.get(f"served_chunks.{t.value}", 0)) for t in Tier}
        total = sum(chunks.values()) or 1
        return {
            "served_bytes": served,
            "served_chunks": chunks,
            "hit_ratio": {t: round(n / total, 4) for t, n in chunks.items()},
            "transferred_bytes": {k.split(".", 1)[1]: int(v) for k, v in c.items() if k.startswith("transferred_bytes.")},
            "requests": {k.split(".", 1)[1]: int(v) for k, v in c.items() if k.startswith("requests.")},
            "stall_seconds": round(c.get("stall_seconds", 0.0), 6),
            "chunks_fetched": fetched,
            "chunks_fetched_more_than_once": dup,
            "inflight": int(self.inflight._value.get()),
            "events": list(self.events),
        }
