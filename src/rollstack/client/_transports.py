"""The node API's calls over HTTP, side by side: `HttpService` (httpx.Client) and its twin
`AsyncHttpService` (httpx.AsyncClient). Both build every request from `client.routes` (the
contract's routes, wire models and decoders), so a call is never spelled twice; the parity test
(tests/unit/contract/test_contract_parity.py) keeps their method lists equal.

The sync one is shared between threads (each thread gets its own connection pool:
`rollstack.core.httppool.PerThreadClient` says why); the async one lives on one event loop.
`ThreadedService` is the async face of a blocking service (the in-process `AsyncNode`).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterator, TypeVar

import httpx

from rollstack.client import routes
from rollstack.client._base import SHORT_TIMEOUT, Settings, error_of, raise_for
from rollstack.contract.service import EnvironmentService
from rollstack.core.httppool import PerThreadClient, limits
from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    LeaseRenewal,
    Snapshot,
    SnapshotInfo,
    Stats,
    VolumeInfo,
)

T = TypeVar("T")


class HttpService:
    """The `EnvironmentService` interface over HTTP (the routes are `client.routes`). Safe to
    share between threads: each thread gets its own `httpx.Client` (`rollstack.core.httppool.PerThreadClient`
    says why)."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self._pool = PerThreadClient(lambda ssl_context: httpx.Client(
            base_url=settings.url,
            headers=settings.headers(),
            timeout=httpx.Timeout(SHORT_TIMEOUT, connect=10.0),
            limits=limits(),
            transport=transport,
            verify=ssl_context,
        ), settings.url)

    @property
    def http(self) -> httpx.Client:
        """This thread's client (created on first use)."""
        return self._pool.get()

    def close(self) -> None:
        self._pool.close()

    def _do(self, call: routes.Call[T]) -> T:
        try:
            response = self.http.request(call.method, call.path, **call.kwargs)
        except httpx.TransportError as exc:
            raise call.failure(exc, self.settings.url) from exc
        raise_for(response)
        return call.decode(response)

    def create(self, plan: dict[str, Any], lease: float | None = None,
               idempotency_key: str | None = None) -> CreateResponse:
        return self._do(routes.create(plan, lease, idempotency_key))

    def create_many(self, plan: dict[str, Any], count: int, lease: float | None = None,
                    idempotency_key: str | None = None) -> list[CreateResponse]:
        return self._do(routes.create_many(plan, count, lease, idempotency_key))

    def fork(self, env_id: str, count: int = 1, lease: float | None = None,
             idempotency_key: str | None = None) -> list[CreateResponse]:
        return self._do(routes.fork(env_id, count, lease, idempotency_key))

    def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo:
        return self._do(routes.pause(env_id, mode))

    def resume(self, env_id: str) -> EnvironmentInfo:
        return self._do(routes.resume(env_id))

    def snapshot(self, env_id: str, name: str) -> Snapshot:
        return self._do(routes.snapshot(env_id, name))

    def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        return self._do(routes.snapshots(source))

    def set_network(self, env_id: str, network: Any) -> EnvironmentInfo:
        return self._do(routes.set_network(env_id, network))

    def delete_snapshot(self, name: str) -> None:
        self._do(routes.delete_snapshot(name))

    def create_volume(self, name: str) -> VolumeInfo:
        return self._do(routes.create_volume(name))

    def volumes(self) -> list[VolumeInfo]:
        return self._do(routes.volumes())

    def delete_volume(self, name: str) -> None:
        self._do(routes.delete_volume(name))

    def read_volume_file(self, name: str, path: str) -> bytes:
        return self._do(routes.read_volume_file(name, path))

    def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        self._do(routes.write_volume_file(name, path, data))

    def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal:
        return self._do(routes.renew(env_ids, lease))

    def renew_one(self, env_id: str, lease: float | None = None) -> LeaseRenewal:
        return self._do(routes.renew_one(env_id, lease))

    def list(self) -> list[EnvironmentInfo]:
        return self._do(routes.list_environments())

    def info(self, env_id: str) -> EnvironmentInfo:
        return self._do(routes.info(env_id))

    def exec(self, env_id: str, request: ExecRequest) -> ExecResult:
        return self._do(routes.exec_(env_id, request))

    def exec_stream(self, env_id: str, request: ExecRequest) -> Iterator[ExecChunk]:
        call = routes.exec_stream(env_id, request)
        try:
            with self.http.stream(call.method, call.path, **call.kwargs) as response:
                if response.status_code >= 400:
                    raise error_of(response.status_code, response.read())
                for line in response.iter_lines():
                    if line.strip():
                        yield routes.chunk(line)
        except httpx.TransportError as exc:
            raise call.failure(exc, self.settings.url) from exc

    def read_file(self, env_id: str, path: str) -> bytes:
        return self._do(routes.read_file(env_id, path))

    def write_file(self, env_id: str, path: str, data: bytes) -> None:
        self._do(routes.write_file(env_id, path, data))

    def diff(self, env_id: str, binary: str = "name") -> str:
        return self._do(routes.diff(env_id, binary))

    def evaluate(self, env_id: str) -> Evaluation:
        return self._do(routes.evaluate(env_id))

    def stats(self, env_id: str) -> Stats:
        return self._do(routes.stats(env_id))

    def destroy(self, env_id: str) -> None:
        self._do(routes.destroy(env_id))

    def health(self) -> Health:
        return self._do(routes.health())

    def metrics(self) -> dict[str, float]:
        """The node's gauges (`NodeService.metrics()`), read from its /metrics."""
        return self._do(routes.metrics())

    def metrics_text(self) -> str:
        return self._do(routes.metrics_text())


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

    async def fork(self, env_id: str, count: int = 1, lease: float | None = None,
                   idempotency_key: str | None = None) -> list[CreateResponse]:
        return await self._do(routes.fork(env_id, count, lease, idempotency_key))

    async def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo:
        return await self._do(routes.pause(env_id, mode))

    async def resume(self, env_id: str) -> EnvironmentInfo:
        return await self._do(routes.resume(env_id))

    async def snapshot(self, env_id: str, name: str) -> Snapshot:
        return await self._do(routes.snapshot(env_id, name))

    async def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        return await self._do(routes.snapshots(source))

    async def set_network(self, env_id: str, network: Any) -> EnvironmentInfo:
        return await self._do(routes.set_network(env_id, network))

    async def delete_snapshot(self, name: str) -> None:
        await self._do(routes.delete_snapshot(name))

    async def create_volume(self, name: str) -> VolumeInfo:
        return await self._do(routes.create_volume(name))

    async def volumes(self) -> list[VolumeInfo]:
        return await self._do(routes.volumes())

    async def delete_volume(self, name: str) -> None:
        await self._do(routes.delete_volume(name))

    async def read_volume_file(self, name: str, path: str) -> bytes:
        return await self._do(routes.read_volume_file(name, path))

    async def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        await self._do(routes.write_volume_file(name, path, data))

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


class ThreadedService:
    """A blocking `EnvironmentService` (an in-process `NodeService`) as an
    `AsyncEnvironmentService`: each call runs in a worker thread (`asyncio.to_thread`)."""

    def __init__(self, service: EnvironmentService) -> None:
        self.service = service

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def create(self, plan: dict[str, Any], lease: float | None = None,
                     idempotency_key: str | None = None) -> CreateResponse:
        options = {k: v for k, v in (("lease", lease), ("idempotency_key", idempotency_key)) if v is not None}
        return await self._run(self.service.create, plan, **options)

    async def create_many(self, plan: dict[str, Any], count: int, lease: float | None = None,
                          idempotency_key: str | None = None) -> list[CreateResponse]:
        options = {k: v for k, v in (("lease", lease), ("idempotency_key", idempotency_key)) if v is not None}
        return await self._run(self.service.create_many, plan, count, **options)

    async def fork(self, env_id: str, count: int = 1, lease: float | None = None,
                   idempotency_key: str | None = None) -> list[CreateResponse]:
        options = {"idempotency_key": idempotency_key} if idempotency_key is not None else {}
        return await self._run(self.service.fork, env_id, count, lease, **options)

    async def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo:
        return await self._run(self.service.pause, env_id, mode)

    async def resume(self, env_id: str) -> EnvironmentInfo:
        return await self._run(self.service.resume, env_id)

    async def snapshot(self, env_id: str, name: str) -> Snapshot:
        return await self._run(self.service.snapshot, env_id, name)

    async def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        return await self._run(self.service.snapshots, source)

    async def set_network(self, env_id: str, network: Any) -> EnvironmentInfo:
        return await self._run(self.service.set_network, env_id, network)

    async def delete_snapshot(self, name: str) -> None:
        await self._run(self.service.delete_snapshot, name)

    async def create_volume(self, name: str) -> VolumeInfo:
        return await self._run(self.service.create_volume, name)

    async def volumes(self) -> list[VolumeInfo]:
        return await self._run(self.service.volumes)

    async def delete_volume(self, name: str) -> None:
        await self._run(self.service.delete_volume, name)

    async def read_volume_file(self, name: str, path: str) -> bytes:
        return await self._run(self.service.read_volume_file, name, path)

    async def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        await self._run(self.service.write_volume_file, name, path, data)

    async def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal:
        return await self._run(self.service.renew, env_ids, lease)

    async def list(self) -> list[EnvironmentInfo]:
        return await self._run(self.service.list)

    async def info(self, env_id: str) -> EnvironmentInfo:
        return await self._run(self.service.info, env_id)

    async def exec(self, env_id: str, request: ExecRequest) -> ExecResult:
        return await self._run(self.service.exec, env_id, request)

    async def exec_stream(self, env_id: str, request: ExecRequest) -> AsyncIterator[ExecChunk]:
        chunks: Iterator[ExecChunk] = await self._run(self.service.exec_stream, env_id, request)
        done = object()
        try:
            while (chunk := await self._run(next, chunks, done)) is not done:
                yield chunk
        finally:
            close = getattr(chunks, "close", None)  # a generator: end it (its exec is cancelled)
            if close is not None:
                await self._run(close)

    async def read_file(self, env_id: str, path: str) -> bytes:
        return await self._run(self.service.read_file, env_id, path)

    async def write_file(self, env_id: str, path: str, data: bytes) -> None:
        await self._run(self.service.write_file, env_id, path, data)

    async def diff(self, env_id: str, binary: str = "name") -> str:
        return await self._run(self.service.diff, env_id, binary)

    async def evaluate(self, env_id: str) -> Evaluation:
        return await self._run(self.service.evaluate, env_id)

    async def stats(self, env_id: str) -> Stats:
        return await self._run(self.service.stats, env_id)

    async def destroy(self, env_id: str) -> None:
        await self._run(self.service.destroy, env_id)

    async def health(self) -> Health:
        return await self._run(self.service.health)

    async def metrics(self) -> dict[str, float]:
        return await self._run(self.service.metrics)
