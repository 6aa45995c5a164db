"""`Client`: the node agent's HTTP API, synchronously (httpx).

    with Client("http://127.0.0.1:7878", token=...) as client:
        with client.create("plan.yaml") as env:
            print(env.exec("pytest -q", timeout=60).exit_code)

Tests hand in `transport=httpx.MockTransport(...)` or an ASGI transport instead of a server.
One `Client` may be shared by any number of threads (each thread has its own connection pool).
"""

from __future__ import annotations

from typing import Any, Iterator, TypeVar

import httpx

from rollstack.client._base import (
    SHORT_TIMEOUT,
    Settings,
    error_of,
    raise_for,
)
from rollstack.client import routes
from rollstack.client.environment import EnvironmentFacade
from rollstack.client.leases import DEFAULT_LEASE, LeaseKeeper
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
    Stats,
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
