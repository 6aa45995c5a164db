"""Lease keepers: renew the leases of the environments a client created and still holds.

A client that creates with a lease (`Client(lease=60)`, the default) promises the node to renew
it; if the client dies, the node reaps its environments once the lease lapses (docs/node.md,
"Leases") instead of holding its capacity for the environments' whole lifetime. The keeper renews
every held environment with one bulk request per node (`POST /v1/leases`) every `interval`
(a third of the lease), on a daemon thread (`LeaseKeeper`) or an asyncio task
(`AsyncLeaseKeeper`), started by the first environment and stopped by the client's close.

An environment is held from its create until it is destroyed through the client (or its handle),
the node reports it missing (destroyed elsewhere, reaped), or the client closes. A renewal that
fails (the node is unreachable) is retried at the next interval: a lease survives a network blip
shorter than two intervals. A node (or gateway) without the bulk route gets one request per
environment instead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Iterator

from rollstack.errors import EnvironmentNotFound, NotFound, RollstackError

log = logging.getLogger(__name__)

DEFAULT_LEASE = 60.0
"""Seconds: an SDK client's lease (renewed every third of it)."""
RENEW_BATCH = 1000
"""Ids per renewal request."""


class _Held:
    """The bookkeeping both keepers share: held ids per service (one service per node)."""

    def __init__(self, lease: float, interval: float | None = None) -> None:
        if lease <= 0:
            raise ValueError(f"a lease is a positive number of seconds, not {lease}")
        self.lease = float(lease)
        self.interval = float(interval) if interval else self.lease / 3
        self._held: dict[Any, set[str]] = {}
        self._lock = threading.Lock()

    def held(self) -> set[str]:
        with self._lock:
            return {i for ids in self._held.values() for i in ids}

    def _add(self, service: Any, env_ids: list[str]) -> None:
        with self._lock:
            self._held.setdefault(service, set()).update(env_ids)

    def release(self, env_id: str) -> None:
        """Stop renewing `env_id` (it was destroyed)."""
        with self._lock:
            for ids in self._held.values():
                ids.discard(env_id)

    def _batches(self) -> Iterator[tuple[Any, list[str]]]:
        with self._lock:
            snapshot = [(svc, sorted(ids)) for svc, ids in self._held.items() if ids]
        for svc, ids in snapshot:
            for i in range(0, len(ids), RENEW_BATCH):
                yield svc, ids[i:i + RENEW_BATCH]

    def _drop(self, service: Any, missing: list[str]) -> None:
        if missing:
            log.info("%d environment(s) are gone from %s; no longer renewed", len(missing),
                     getattr(getattr(service, "settings", None), "url", "the node"))
        with self._lock:
            self._held.get(service, set()).difference_update(missing)

    @staticmethod
    def _route_missing(exc: RollstackError) -> bool:
        """A 404 for the route itself (an older node, a gateway), not for an environment: a
        plain `not_found`, or a 404 without our error body (a framework's default answer)."""
        return type(exc) is NotFound or (type(exc) is RollstackError and getattr(exc, "status", None) == 404)


class LeaseKeeper(_Held):
    """Renews on a daemon thread (sync clients)."""

    def __init__(self, lease: float, interval: float | None = None) -> None:
        super().__init__(lease, interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, service: Any, env_ids: list[str]) -> None:
        self._add(service, env_ids)
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            if not alive and not self._stop.is_set():  # first use, or a renewer that died
                self._thread = threading.Thread(target=self._loop, name="rollstack-lease", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.renew_now()

    def renew_now(self) -> None:
        """One round: renew every held environment (one request per node and batch)."""
        for svc, ids in self._batches():
            if self._stop.is_set():
                return
            try:
                self._drop(svc, self._renew(svc, ids))
            except Exception as exc:  # noqa: BLE001 - any failure is retried next interval: the
                # renewer must outlive a bad answer, or every held environment's lease lapses
                log.warning("renewing %d lease(s) failed: %s: %s", len(ids), type(exc).__name__, exc)

    @classmethod
    def _renew(cls, svc: Any, ids: list[str]) -> list[str]:
        try:
            return svc.renew(ids).missing
        except RollstackError as exc:
            if not cls._route_missing(exc):
                raise
        missing = []
        for env_id in ids:
            try:
                svc.renew_one(env_id)
            except EnvironmentNotFound:
                missing.append(env_id)
        return missing

    def close(self) -> None:
        """Stop renewing (the held environments' leases then lapse unless destroyed)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)


class AsyncLeaseKeeper(_Held):
    """Renews on an asyncio task of the loop that created the first environment (async clients)."""

    def __init__(self, lease: float, interval: float | None = None) -> None:
        super().__init__(lease, interval)
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def hold(self, service: Any, env_ids: list[str]) -> None:
        self._add(service, env_ids)
        if (self._task is None or self._task.done()) and not self._closed:  # first, or its loop ended
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="rollstack-lease")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.renew_now()

    async def renew_now(self) -> None:
        for svc, ids in self._batches():
            try:
                self._drop(svc, await self._renew(svc, ids))
            except Exception as exc:  # noqa: BLE001 - as in LeaseKeeper.renew_now
                log.warning("renewing %d lease(s) failed: %s: %s", len(ids), type(exc).__name__, exc)

    @classmethod
    async def _renew(cls, svc: Any, ids: list[str]) -> list[str]:
        try:
            return (await svc.renew(ids)).missing
        except RollstackError as exc:
            if not cls._route_missing(exc):
                raise
        missing = []
        for env_id in ids:
            try:
                await svc.renew_one(env_id)
            except EnvironmentNotFound:
                missing.append(env_id)
        return missing

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, RuntimeError):  # RuntimeError: another loop's task
                pass
