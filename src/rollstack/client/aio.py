"""`AsyncClient` and `AsyncEnvironment`: the `Client` interface with async/await.

    async with AsyncClient(url, token=...) as client:
        async with await client.create(plan) as env:
            r = await env.exec("pytest -q", timeout=60)

`AsyncHttpService` is the async twin of `HttpService`: the same routes and wire models
(`client.routes`) over `httpx.AsyncClient`; the handles mirror `Environment` /
`EnvironmentFacade` method for method.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, TypeVar, overload

import httpx

from rollstack.client import routes
from rollstack.client.environment import create_options
from rollstack.client.leases import DEFAULT_LEASE, AsyncLeaseKeeper
from rollstack.core.httppool import limits
from rollstack.client._base import (
    SHORT_TIMEOUT,
    Settings,
    error_of,
    exec_request,
    plan_to_wire,
    raise_for,
)
from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    LeaseRenewal,
    Stats,
)

T = TypeVar("T")


class AsyncHttpService:
    """The `EnvironmentService` interface over HTTP, with `async def` methods."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.http = httpx.AsyncClient(
            base_url=settings.url,
            headers=settings.headers(),
            timeout=httpx.Timeout(SHORT_TIMEOUT, connect=10.0),
            limits=limits(),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _do(self, call: routes.Call[T]) -> T:
        try:
            response = await self.http.request(call.method, call.path, **call.kwargs)
        except httpx.TransportError as exc:
            raise call.failure(exc, self.settings.url) from exc
        raise_for(response)
        return call.decode(response)

    async def create(self, plan: dict[str, Any], lease: float | None = None,
               idempotency_key: str | None = None) -> CreateResponse:
        return await self._do(routes.create(plan, lease, idempotency_key))

    async def create_many(self, plan: dict[str, Any], count: int, lease: float | None = None,
                    idempotency_key: str | None = None) -> list[CreateResponse]:
        return await self._do(routes.create_many(plan, count, lease, idempotency_key))

    async def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal:
        return await self._do(routes.renew(env_ids, lease))

    async def renew_one(self, env_id: str, lease: float | None = None) -> LeaseRenewal:
        return await self._do(routes.renew_one(env_id, lease))

    async def list(self) -> list[EnvironmentInfo]:
        return await self._do(routes.list_environments())

    async def info(self, env_id: str) -> EnvironmentInfo:
        return await self._do(routes.info(env_id))

    async def exec(self, env_id: str, request: ExecRequest) -> ExecResult:
        return await self._do(routes.exec_(env_id, request))

    async def exec_stream(self, env_id: str, request: ExecRequest) -> AsyncIterator[ExecChunk]:
        call = routes.exec_stream(env_id, request)
        try:
            async with self.http.stream(call.method, call.path, **call.kwargs) as response:
                if response.status_code >= 400:
                    raise error_of(response.status_code, await response.aread())
                async for line in response.aiter_lines():
                    if line.strip():
                        yield routes.chunk(line)
        except httpx.TransportError as exc:
            raise call.failure(exc, self.settings.url) from exc

    async def read_file(self, env_id: str, path: str) -> bytes:
        return await self._do(routes.read_file(env_id, path))

    async def write_file(self, env_id: str, path: str, data: bytes) -> None:
        await self._do(routes.write_file(env_id, path, data))

    async def diff(self, env_id: str, binary: str = "name") -> str:
        return await self._do(routes.diff(env_id, binary))

    async def evaluate(self, env_id: str) -> Evaluation:
        return await self._do(routes.evaluate(env_id))

    async def stats(self, env_id: str) -> Stats:
        return await self._do(routes.stats(env_id))

    async def destroy(self, env_id: str) -> None:
        await self._do(routes.destroy(env_id))

    async def health(self) -> Health:
        return await self._do(routes.health())

    async def metrics(self) -> dict[str, float]:
        return await self._do(routes.metrics())

    async def metrics_text(self) -> str:
        return await self._do(routes.metrics_text())


class AsyncEnvironment:
    """One environment, async. `async with` always destroys it on exit."""

    def __init__(self, service: AsyncHttpService, env_id: str, created: CreateResponse | None = None,
                 leases: Any = None):
        self._service = service
        self.id = env_id
        self.created = created
        self._leases = leases

    def __repr__(self) -> str:
        return f"AsyncEnvironment({self.id!r})"

    async def __aenter__(self) -> "AsyncEnvironment":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    async def exec(self, command: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        """Run `command` (shell string or argv) to completion. A timeout is reported, not raised."""
        return await self._service.exec(self.id, exec_request(command, timeout, cwd, env, stdin))

    def exec_stream(self, command: str | list[str], timeout: float | None = None, cwd: str | None = None,
                    env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> AsyncIterator[ExecChunk]:
        """Chunks of type `stdout`/`stderr` as they come, then one `result`."""
        return self._service.exec_stream(self.id, exec_request(command, timeout, cwd, env, stdin))

    async def read_file(self, path: str) -> bytes:
        return await self._service.read_file(self.id, path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._service.write_file(self.id, path, data.encode() if isinstance(data, str) else data)

    async def diff(self, binary: str = "name") -> str:
        return await self._service.diff(self.id, binary)

    async def evaluate(self) -> Evaluation:
        return await self._service.evaluate(self.id)

    async def stats(self) -> Stats:
        return await self._service.stats(self.id)

    async def info(self) -> EnvironmentInfo:
        return await self._service.info(self.id)

    async def destroy(self) -> None:
        """Idempotent."""
        await self._service.destroy(self.id)
        if self._leases is not None:
            self._leases.release(self.id)


class AsyncClient:
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

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._leases is not None:
            await self._leases.aclose()
        await self._service.aclose()

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
