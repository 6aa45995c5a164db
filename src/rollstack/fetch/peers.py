"""`PeerClient`: asks other nodes' lazy-store daemons for a chunk before the registry.

Each peer serves `GET /v1/chunks/<digest>` (decompressed bytes, 404 when it lacks the chunk).
Peers are an optimisation, never a dependency: a short timeout, and a peer that failed to
answer is skipped for `dead_for` seconds, so a dead peer costs one timeout, not one per read.
The caller verifies every byte against the chunk digest (a peer is not trusted).

Cross-node single flight: with `self_url` set, every peer is asked to `wait` (up to `wait` s) for
a chunk it is fetching right now. A peer that sorts before this node waits on its fetch at any
stage; a peer after it only on a fetch already at the registry stage (which waits on no one). So
when several nodes start on the same chunk together only the first in that order pulls it from
the registry, a node that is ahead is waited for by the others, and no wait cycle can form
(edges either go down a total order or end at a fetch that waits on nobody).
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import httpx


class PeerClient:
    def __init__(self, urls: Sequence[str], *, timeout: float = 0.25, dead_for: float = 10.0,
                 self_url: str | None = None, wait: float = 5.0) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.self_url = self_url.rstrip("/") if self_url else None
        self.timeout, self.wait = timeout, wait
        self.dead_for = dead_for
        self._dead_until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=httpx.Timeout(timeout), limits=httpx.Limits(max_connections=32))
        self.hits = 0
        self.misses = 0
        self.failures = 0

    def set_urls(self, urls: Sequence[str], self_url: str | None = None) -> None:
        """Replace the peer set (a cluster learns its members as they come and go)."""
        fresh = [u.rstrip("/") for u in urls]
        with self._lock:
            self.urls = fresh
            if self_url is not None:
                self.self_url = self_url.rstrip("/")
            self._dead_until = {u: t for u, t in self._dead_until.items() if u in fresh}

    def _alive(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [u for u in self.urls if self._dead_until.get(u, 0.0) <= now]

    def get(self, digest: str) -> tuple[bytes, str] | None:
        """(bytes, peer url) from the first live peer holding `digest`, else None. Blocking."""
        for url in self._alive():
            try:
                if self.self_url is not None:
                    params = {"wait": self.wait} if url < self.self_url else {"wait": self.wait, "stage": "registry"}
                    resp = self._http.get(f"{url}/v1/chunks/{digest}", params=params,
                                          timeout=httpx.Timeout(self.timeout, read=self.wait + self.timeout))
                else:
                    resp = self._http.get(f"{url}/v1/chunks/{digest}")
            except httpx.HTTPError:
                with self._lock:
                    self._dead_until[url] = time.monotonic() + self.dead_for
                    self.failures += 1
                continue
            if resp.status_code == 200:
                self.hits += 1
                return resp.content, url
        self.misses += 1
        return None

    def close(self) -> None:
        self._http.close()
