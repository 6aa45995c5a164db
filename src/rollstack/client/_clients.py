"""The clients, side by side: `Client` and `AsyncClient` over a node agent's HTTP API, on one
base each with the in-process twins (`EnvironmentFacade`: `Client`, `Node`;
`AsyncEnvironmentFacade`: `AsyncClient`, `AsyncNode`).

    with Client("http://127.0.0.1:7878", token=...) as client:
        with client.create("plan.yaml") as env:
            print(env.exec("pytest -q", timeout=60).exit_code)

    async with AsyncClient(url, token=...) as client:
        async with await client.create(plan) as env:
            r = await env.exec("pytest -q", timeout=60)

Tests hand in `transport=httpx.MockTransport(...)` or an ASGI transport instead of a server.
One `Client` may be shared by any number of threads; an `AsyncClient` lives on one loop.
"""

from __future__ import annotations

from typing import Any, overload

import httpx

from rollstack.client._base import Settings, plan_to_wire
from rollstack.client._handles import AsyncEnvironment, Environment, create_options
from rollstack.client._transports import AsyncHttpService, HttpService
from rollstack.client.leases import DEFAULT_LEASE, AsyncLeaseKeeper, LeaseKeeper
from rollstack.contract.models import EnvironmentInfo, Health, SnapshotInfo, VolumeInfo
from rollstack.contract.service import AsyncEnvironmentService, EnvironmentService


class EnvironmentFacade:
    """`create/get/list` over a service; the base of `Client` and `Node`."""

    _service: EnvironmentService
    _leases: Any = None
    """A `client.leases.LeaseKeeper` when the facade creates with a lease."""

    @overload
    def create(self, plan: Any, *, idempotency_key: str | None = None) -> Environment: ...

    @overload
    def create(self, plan: Any, count: int, *, idempotency_key: str | None = None) -> list[Environment]: ...

    def create(self, plan: Any, count: int | None = None, *,
               idempotency_key: str | None = None) -> Environment | list[Environment]:
        """`plan`: a dict, a path to a plan YAML file, or a `Plan`. With `count`, that many
        environments of the plan in one call (a GRPO group, all or none), as a list.
        `idempotency_key`: retrying the create with the same key (after a lost answer) returns
        the same environment(s), never a second set."""
        options = create_options(self._leases, idempotency_key)
        if count is not None:
            group = self._service.create_many(plan_to_wire(plan), count, **options)
            envs = [Environment(self._service, c.id, c, self._leases) for c in group]
        else:
            created = self._service.create(plan_to_wire(plan), **options)
            envs = [Environment(self._service, created.id, created, self._leases)]
        if self._leases is not None:
            self._leases.hold(self._service, [e.id for e in envs])
        return envs if count is not None else envs[0]

    def get(self, env_id: str) -> Environment:
        self._service.info(env_id)  # raises EnvironmentNotFound
        return Environment(self._service, env_id)

    def list(self) -> list[EnvironmentInfo]:
        return self._service.list()

    def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        """The snapshots in the node's store (of environment `source` only, if given)."""
        return self._service.snapshots(source)

    def delete_snapshot(self, name: str) -> None:
        """Remove snapshot `name` (NAME:TAG); `TemplateNotFound` if there is none."""
        self._service.delete_snapshot(name)

    def create_volume(self, name: str) -> VolumeInfo:
        """A new, empty volume plans mount by name (docs/node.md#volumes)."""
        return self._service.create_volume(name)

    def volumes(self) -> list[VolumeInfo]:
        """The node's volumes and which environments mount each."""
        return self._service.volumes()

    def delete_volume(self, name: str) -> None:
        """Remove a volume and its files; `VolumeBusy` while an environment mounts it."""
        self._service.delete_volume(name)

    def read_volume_file(self, name: str, path: str) -> bytes:
        """A file of volume `name` (`/` is the volume's top)."""
        return self._service.read_volume_file(name, path)

    def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        """Write a file into volume `name` (parents made)."""
        self._service.write_volume_file(name, path, data)

    def destroy(self, env_id: str) -> None:
        """Destroy an environment by id (idempotent for ids this node destroyed)."""
        self._service.destroy(env_id)
        if self._leases is not None:
            self._leases.release(env_id)

    def health(self) -> Any:
        return self._service.health()

    def metrics(self) -> dict[str, float]:
        """The node's gauges (`<name>_total` counters, environments, lazy store...)."""
        return self._service.metrics()

    def close(self) -> None:
        pass

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnvironmentFacade:
    """`create/get/list` over an async service; the base of `AsyncClient` and `AsyncNode`."""

    _service: AsyncEnvironmentService
    _leases: Any = None
    """A `client.leases.AsyncLeaseKeeper` when the facade creates with a lease."""

    @overload
    async def create(self, plan: Any, *, idempotency_key: str | None = None) -> AsyncEnvironment: ...

    @overload
    async def create(self, plan: Any, count: int, *, idempotency_key: str | None = None) -> list[AsyncEnvironment]: ...

    async def create(self, plan: Any, count: int | None = None, *,
                     idempotency_key: str | None = None) -> AsyncEnvironment | list[AsyncEnvironment]:
        """`plan`: a dict, a path to a plan YAML file, or a `Plan`. With `count`, that many
        environments of the plan in one call (a GRPO group, all or none), as a list.
        `idempotency_key`: a retry with the same key returns the same environment(s)."""
        options = create_options(self._leases, idempotency_key)
        if count is not None:
            group = await self._service.create_many(plan_to_wire(plan), count, **options)
            envs = [AsyncEnvironment(self._service, c.id, c, self._leases) for c in group]
        else:
            created = await self._service.create(plan_to_wire(plan), **options)
            envs = [AsyncEnvironment(self._service, created.id, created, self._leases)]
        if self._leases is not None:
            self._leases.hold(self._service, [e.id for e in envs])
        return envs if count is not None else envs[0]

    async def get(self, env_id: str) -> AsyncEnvironment:
        await self._service.info(env_id)  # raises EnvironmentNotFound
        return AsyncEnvironment(self._service, env_id)

    async def list(self) -> list[EnvironmentInfo]:
        return await self._service.list()

    async def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        """The snapshots in the node's store (of environment `source` only, if given)."""
        return await self._service.snapshots(source)

    async def delete_snapshot(self, name: str) -> None:
        """Remove snapshot `name` (NAME:TAG); `TemplateNotFound` if there is none."""
        await self._service.delete_snapshot(name)

    async def create_volume(self, name: str) -> VolumeInfo:
        """A new, empty volume plans mount by name (docs/node.md#volumes)."""
        return await self._service.create_volume(name)

    async def volumes(self) -> list[VolumeInfo]:
        """The node's volumes and which environments mount each."""
        return await self._service.volumes()

    async def delete_volume(self, name: str) -> None:
        """Remove a volume and its files; `VolumeBusy` while an environment mounts it."""
        await self._service.delete_volume(name)

    async def read_volume_file(self, name: str, path: str) -> bytes:
        """A file of volume `name` (`/` is the volume's top)."""
        return await self._service.read_volume_file(name, path)

    async def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        """Write a file into volume `name` (parents made)."""
        await self._service.write_volume_file(name, path, data)

    async def destroy(self, env_id: str) -> None:
        """Destroy an environment by id (idempotent for ids this node destroyed)."""
        await self._service.destroy(env_id)
        if self._leases is not None:
            self._leases.release(env_id)

    async def health(self) -> Health:
        return await self._service.health()

    async def metrics(self) -> dict[str, float]:
        """The node's gauges (`<name>_total` counters, environments, lazy store...)."""
        return await self._service.metrics()

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Client(EnvironmentFacade):
    """A node agent over HTTP. `url` defaults to $ROLLSTACK_NODE, `token` to $ROLLSTACK_TOKEN or the
    token file in the node's root.

    `lease` (seconds, default 60): the environments this client creates carry a lease that a
    background thread renews (one request per `renew_interval`, default a third of the lease)
    until they are destroyed or the client closes; if this process dies, the node reaps them
    once the lease lapses. `lease=None`: no lease, they live their plan's lifetime (what
    `rollstack env create` does: its environments outlive the command)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        lease: float | None = DEFAULT_LEASE,
        renew_interval: float | None = None,
    ) -> None:
        self._service = HttpService(Settings.of(url, token), transport)
        self._leases = LeaseKeeper(lease, renew_interval) if lease else None

    @property
    def url(self) -> str:
        return self._service.settings.url

    def close(self) -> None:
        """Stop renewing leases (the environments still held lapse and are reaped), close the
        connections."""
        if self._leases is not None:
            self._leases.close()
        self._service.close()


class AsyncClient(AsyncEnvironmentFacade):
    """A node agent over HTTP, asynchronously. Same defaults and methods as `Client`; leases are
    renewed by a task on the loop of the first create, cancelled by `aclose`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        lease: float | None = DEFAULT_LEASE,
        renew_interval: float | None = None,
    ) -> None:
        self._service = AsyncHttpService(Settings.of(url, token), transport)
        self._leases = AsyncLeaseKeeper(lease, renew_interval) if lease else None

    @property
    def url(self) -> str:
        return self._service.settings.url

    async def aclose(self) -> None:
        if self._leases is not None:
            await self._leases.aclose()
        await self._service.aclose()
