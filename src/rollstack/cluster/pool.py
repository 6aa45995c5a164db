"""`Pool` / `AsyncPool`: many node agents with `Client`'s / `AsyncClient`'s interface.

    with rollstack.Pool(address="10.0.0.1:6379") as pool:        # the Ray cluster's head
        with pool.create("plan.yaml") as env:                       # placed by rollstack.cluster.placement
            env.exec("pytest -q")                                    # straight to its node: no proxy hop

`create` resolves the plan's stack against the cluster's store, asks `place()` for a node (hot
layers, the GRPO group's node up to the spread limit, free capacity) and creates it there; a node
that answers `insufficient_capacity` or is unreachable is skipped and the next choice is tried;
a full pool answers `insufficient_capacity` naming the pool. Every later call on the environment
goes to that node's own URL. When the node dies or restarts under it, the call raises
`NodeLost` (`node_lost`, retryable: resample the rollout elsewhere).

Members: the Ray node actors (`address=`), or `nodes=[{"node_id", "url", "token"}]` for a pool
over agents started by other means.

Leases (`lease=`, default 60 s, like `Client`): every environment the pool created is renewed
with one bulk request per node per interval until it is destroyed or the pool closes
(`client.leases`). `create(..., idempotency_key=K)`: the node's idempotent create; the pool
remembers which node took K (a group member i uses `K/i`) and sends a retry there, so a retry
from the same pool returns the same environment(s).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from rollstack.client._base import Settings, plan_to_wire
from rollstack.client._handles import Environment, create_options
from rollstack.client.leases import DEFAULT_LEASE, AsyncLeaseKeeper, LeaseKeeper
from rollstack.cluster.directory import Directory, Placer
from rollstack.cluster.placement import PlacementPolicy, PlacementRequest
from rollstack.errors import (
    EnvironmentNotFound,
    InsufficientCapacity,
    NodeLost,
    NodeUnavailable,
    RollstackError,
)
from rollstack.contract.models import EnvironmentInfo, Health


def _ray_source(address: str | None) -> Callable[[], list[dict[str, Any]]]:
    from rollstack.cluster import ray_env

    ray_env.connect(address)
    return lambda: ray_env.members(timeout=3.0)


class _Core:
    """What both pools share: members, placement, error translation."""

    def __init__(self, address: str | None, nodes: list[dict[str, Any]] | None, store: str | None,
                 policy: PlacementPolicy, interval: float, name: str) -> None:
        source = (lambda: list(nodes)) if nodes is not None else _ray_source(address)
        self.name = name
        self.directory = Directory(source, interval=interval)
        if store is None:
            store = next((d.get("store") for d in source() if d.get("store")), None)
        self.placer = Placer(store)
        self.policy = policy
        self.decisions: deque[dict[str, Any]] = deque(maxlen=100_000)
        """Recent placements: node, and the share of the stack's bytes already hot there (benchmarks)."""
        self.first_lost: dict[str, float] = {}
        """node_id -> time.monotonic() of the first `node_lost` this pool raised for it."""

    def choose(self, req: PlacementRequest, exclude: set[str]) -> tuple[str, dict[str, Any]]:
        """(node, decision record); the caller sets record["created"] once the node took it."""
        node_id, hot = self.directory.place(req, self.policy, frozenset(exclude), self.name)
        record = {"node": node_id, "hot": hot, "t": time.monotonic(), "created": False}
        self.decisions.append(record)
        return node_id, record

    def attempt(self, req: PlacementRequest, excluded: set[str]) -> "_Attempt":
        """One try at placing `req` on a node not in `excluded` (the caller does the create)."""
        return _Attempt(self, req, excluded)

    def translate(self, exc: RollstackError, node_id: str, instance: str | None) -> RollstackError:
        """A failed call on an environment of `node_id` -> NodeLost when the node is gone or restarted."""
        if isinstance(exc, (NodeUnavailable, EnvironmentNotFound)) and not isinstance(exc, NodeLost):
            if self.directory.lost(node_id, instance):
                m = self.directory.member(node_id)
                self.first_lost.setdefault(node_id, time.monotonic())
                return NodeLost(f"node {node_id} ({m.url if m else '?'}) was lost: {exc}", node=node_id)
        return exc

    def close(self) -> None:
        self.directory.close()


class _Attempt:
    """One try at creating an environment on the node `place()` chose, for both pools' `create`:

        with core.attempt(req, excluded) as at:
            created = <create on at.node_id>       # the pool's own I/O, sync or async
        if at.placed: ...                            # else: try the next choice

    The node is reserved for the try and released after it. A node that answers
    `insufficient_capacity` is skipped; an unreachable one is marked dead and skipped (both
    suppressed, `placed` stays False); any other error propagates. `place()` raises
    `InsufficientCapacity` naming the pool when no node is left."""

    def __init__(self, core: _Core, req: PlacementRequest, excluded: set[str]) -> None:
        self.node_id, self._record = core.choose(req, excluded)
        self._core, self._req, self._excluded = core, req, excluded
        self.placed = False
        core.directory.reserve(self.node_id, req)

    def __enter__(self) -> "_Attempt":
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        directory = self._core.directory
        directory.release(self.node_id, self._req, created=exc is None)
        if exc is None:
            self.placed = self._record["created"] = True
            return False
        if isinstance(exc, NodeUnavailable):
            directory.mark_dead(self.node_id)
        if isinstance(exc, (InsufficientCapacity, NodeUnavailable)):
            self._excluded.add(self.node_id)
            return True
        return False


class _Bound:
    """One environment's node service (`http`) for `Environment`: its calls' errors are
    translated (`_Core.translate`: `node_lost` when the node is gone). Sync and async twins."""

    def __init__(self, core: _Core, node_id: str, http: Any, instance: str | None) -> None:
        self._core, self.node_id, self._http, self._instance = core, node_id, http, instance


class _BoundService(_Bound):
    """The `EnvironmentService` of one environment: its node's HTTP service, errors translated."""

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._http, name)
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                out = fn(*args, **kwargs)
            except RollstackError as exc:
                raise self._core.translate(exc, self.node_id, self._instance) from exc
            if name == "exec_stream":
                return self._stream(out)
            return out

        return call

    def _stream(self, chunks: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from chunks
        except RollstackError as exc:
            raise self._core.translate(exc, self.node_id, self._instance) from exc


class _Pool:
    """What `Pool` and `AsyncPool` share: the core, and one HTTP service per node URL (a node
    back on a new URL gets a new one), made by the subclass's `_new_service`."""

    _KEYS = 65536
    """Idempotency keys remembered (key -> the node that took the create)."""

    def __init__(self, address: str | None = None, *, nodes: list[dict[str, Any]] | None = None,
                 store: str | None = None, policy: PlacementPolicy | None = None, interval: float = 1.0,
                 name: str = "pool", lease: float | None = DEFAULT_LEASE, renew_interval: float | None = None) -> None:
        self._core = _Core(address, nodes, store, policy or PlacementPolicy(), interval, name)
        self._services: dict[str, Any] = {}
        self._leases: Any = self._keeper(lease, renew_interval) if lease else None
        self._key_nodes: dict[str, str] = {}

    def _keeper(self, lease: float, interval: float | None) -> Any:
        raise NotImplementedError

    @staticmethod
    def _member_key(key: str | None, i: int, count: int | None) -> str | None:
        return key if key is None or count is None else f"{key}/{i}"

    def _pinned(self, key: str | None) -> set[str]:
        """For a retried key: every node but the one that took it (tried first), else nothing."""
        node_id = self._key_nodes.get(key) if key else None
        if node_id is None or self._core.directory.member(node_id) is None:
            return set()
        return {n for n in self._core.directory.members if n != node_id}

    def _took(self, key: str | None, node_id: str) -> None:
        if key is None:
            return
        self._key_nodes[key] = node_id
        while len(self._key_nodes) > self._KEYS:
            self._key_nodes.pop(next(iter(self._key_nodes)))

    @property
    def directory(self) -> Directory:
        return self._core.directory

    def _service(self, node_id: str) -> Any:
        m = self._core.directory.member(node_id)
        if m is None:
            raise NodeLost(f"node {node_id} is not a member of the pool", node=node_id)
        svc = self._services.get(node_id)
        if svc is None or svc.settings.url != m.url:
            svc = self._services[node_id] = self._new_service(m.url, m.token)
        return svc

    def _new_service(self, url: str, token: str | None) -> Any:
        raise NotImplementedError

    def nodes(self) -> list[Any]:
        return self._core.directory.views()

    def _locate(self, env_id: str) -> str:
        self._core.directory.poll()
        for m in list(self._core.directory.members.values()):
            if m.alive and env_id in (m.info or {}).get("env_ids", []):
                return m.node_id
        raise EnvironmentNotFound(f"no environment {env_id!r} in the pool")

    def _health(self) -> Health:
        views = self._core.directory.views()
        alive = [v for v in views if v.alive]
        n = sum(int((self._core.directory.members[v.node_id].info or {}).get("environments", 0)) for v in alive)
        return Health(status="ok" if alive else "unavailable", environments=n)


class Pool(_Pool):
    """The pool over HTTP, synchronously (see the module docstring)."""

    def _keeper(self, lease: float, interval: float | None) -> Any:
        return LeaseKeeper(lease, interval)

    def _new_service(self, url: str, token: str | None) -> Any:
        from rollstack.client._transports import HttpService

        return HttpService(Settings(url=url, token=token))

    def _bound(self, node_id: str) -> _BoundService:
        return _BoundService(self._core, node_id, self._service(node_id), self._core.directory.instance(node_id))

    def create(self, plan: Any, count: int | None = None, *, idempotency_key: str | None = None) -> Any:
        """One environment, or a list of `count` (placed together, created in parallel)."""
        wire = plan_to_wire(plan)
        if count is None:
            return self._create_one(wire, self._core.placer.request(wire), idempotency_key)
        req = self._core.placer.request(wire)
        with ThreadPoolExecutor(max_workers=min(16, max(1, count))) as ex:
            futures = [ex.submit(self._create_one, wire, req, self._member_key(idempotency_key, i, count))
                       for i in range(count)]
            envs, errors = [], []
            for f in futures:
                try:
                    envs.append(f.result())
                except RollstackError as exc:
                    errors.append(exc)
        if errors:
            for env in envs:
                env.destroy()
            raise errors[0]
        return envs

    def _create_one(self, wire: dict[str, Any], req: PlacementRequest, key: str | None = None) -> Environment:
        excluded = self._pinned(key)
        options = create_options(self._leases, key)
        pinned = self._key_nodes.get(key) if excluded and key else None
        while True:
            try:
                with self._core.attempt(req, excluded) as at:  # raises InsufficientCapacity naming the pool
                    bound = self._bound(at.node_id)
                    created = bound._http.create(wire, **options)  # noqa: SLF001 - the raw call: errors handled by `at`
            except InsufficientCapacity:
                if not pinned:
                    raise
                excluded, pinned = {pinned}, None  # the node that took the key is gone: place anew
                continue
            if at.placed:
                self._took(key, at.node_id)
                env = Environment(bound, created.id, created, self._leases)
                env.node_id = at.node_id  # type: ignore[attr-defined]
                if self._leases is not None:
                    self._leases.hold(bound._http, [created.id])  # noqa: SLF001 - renewals need no translation
                return env

    def get(self, env_id: str) -> Environment:
        node_id = self._locate(env_id)
        env = Environment(self._bound(node_id), env_id, leases=self._leases)
        env.node_id = node_id  # type: ignore[attr-defined]
        return env

    def destroy(self, env_id: str) -> None:
        self.get(env_id).destroy()

    def list(self) -> list[EnvironmentInfo]:
        out: list[EnvironmentInfo] = []
        for m in list(self._core.directory.members.values()):
            if m.alive:
                try:
                    out += self._service(m.node_id).list()
                except NodeUnavailable:
                    self._core.directory.mark_dead(m.node_id)
        return out

    def health(self) -> Health:
        return self._health()

    def close(self) -> None:
        if self._leases is not None:
            self._leases.close()
        for svc in self._services.values():
            svc.close()
        self._core.close()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- async ----------------------------------------------------------------------------------------

class _AsyncBound(_Bound):
    """The async twin of `_BoundService`: one node's `AsyncHttpService`, errors translated."""

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._http, name)
        if not callable(fn):
            return fn
        if name == "exec_stream":
            return functools.wraps(fn)(lambda *a, **kw: self._stream(fn(*a, **kw)))

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except RollstackError as exc:
                raise await self._translate(exc) from exc

        return call

    async def _translate(self, exc: RollstackError) -> RollstackError:
        return await asyncio.to_thread(self._core.translate, exc, self.node_id, self._instance)

    async def _stream(self, chunks: Any) -> Any:
        try:
            async for chunk in chunks:
                yield chunk
        except RollstackError as exc:
            raise await self._translate(exc) from exc


class AsyncPool(_Pool):
    """`Pool` with async/await (`AsyncClient`'s interface)."""

    def _keeper(self, lease: float, interval: float | None) -> Any:
        return AsyncLeaseKeeper(lease, interval)

    def _new_service(self, url: str, token: str | None) -> Any:
        from rollstack.client._transports import AsyncHttpService

        return AsyncHttpService(Settings.of(url, token or ""))

    async def create(self, plan: Any, count: int | None = None, *, idempotency_key: str | None = None) -> Any:
        from rollstack.client._handles import AsyncEnvironment

        wire = plan_to_wire(plan)
        req = await asyncio.to_thread(self._core.placer.request, wire)
        if count is not None:
            results = await asyncio.gather(*(self._create_one(wire, req, AsyncEnvironment,
                                                              self._member_key(idempotency_key, i, count))
                                             for i in range(count)),
                                           return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                await asyncio.gather(*(r.destroy() for r in results if not isinstance(r, BaseException)),
                                     return_exceptions=True)
                raise errors[0]
            return list(results)
        return await self._create_one(wire, req, AsyncEnvironment, idempotency_key)

    async def _create_one(self, wire: dict[str, Any], req: PlacementRequest, cls: Any, key: str | None = None) -> Any:
        core = self._core
        excluded = self._pinned(key)
        options = create_options(self._leases, key)
        pinned = self._key_nodes.get(key) if excluded and key else None
        while True:
            try:
                with core.attempt(req, excluded) as at:
                    service = self._service(at.node_id)
                    created = await service.create(wire, **options)
            except InsufficientCapacity:
                if not pinned:
                    raise
                excluded, pinned = {pinned}, None
                continue
            if at.placed:
                self._took(key, at.node_id)
                env = cls(_AsyncBound(core, at.node_id, service, core.directory.instance(at.node_id)),
                          created.id, created, self._leases)
                env.node_id = at.node_id
                if self._leases is not None:
                    self._leases.hold(service, [created.id])
                return env

    async def get(self, env_id: str) -> Any:
        from rollstack.client._handles import AsyncEnvironment

        node_id = await asyncio.to_thread(self._locate, env_id)
        env = AsyncEnvironment(_AsyncBound(self._core, node_id, self._service(node_id),  # type: ignore[arg-type]
                                           self._core.directory.instance(node_id)), env_id, leases=self._leases)
        env.node_id = node_id  # type: ignore[attr-defined]
        return env

    async def list(self) -> list[EnvironmentInfo]:
        out: list[EnvironmentInfo] = []
        for m in list(self._core.directory.members.values()):
            if m.alive:
                try:
                    out += await self._service(m.node_id).list()
                except NodeUnavailable:
                    self._core.directory.mark_dead(m.node_id)
        return out

    async def health(self) -> Health:
        return self._health()

    async def aclose(self) -> None:
        if self._leases is not None:
            await self._leases.aclose()
        for svc in self._services.values():
            await svc.aclose()
        await asyncio.to_thread(self._core.close)

    async def __aenter__(self) -> "AsyncPool":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["Pool", "AsyncPool"]
