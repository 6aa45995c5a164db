"""`Client`: the node agent's HTTP API, synchronously (httpx).

    with Client("http://127.0.0.1:7878", token=...) as client:
        with client.create("plan.yaml") as env:
            print(env.exec("pytest -q", timeout=60).exit_code)

Tests hand in `transport=httpx.MockTransport(...)` or an ASGI transport instead of a server.
One `Client` may be shared by any number of threads (each thread has its own connection pool).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

import httpx

from rollstack.client._base import (
    SHORT_TIMEOUT,
    Settings,
    default_token,
    error_of,
    raise_for,
    request_timeout,
    transport_error,
)
from rollstack.client.environment import EnvironmentFacade
from rollstack.errors import from_dict
from rollstack.httppool import PerThreadClient
from rollstack.node.models import (
    CreateGroupResponse,
    CreateResponse,
    EnvironmentInfo,
    EnvironmentList,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    Stats,
)


class HttpService:
    """The `EnvironmentService` interface over HTTP. Safe to share between threads: each thread
    gets its own `httpx.Client` (`rollstack.httppool.PerThreadClient` says why)."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self._pool = PerThreadClient(lambda ssl_context: httpx.Client(
            base_url=settings.url,
            headers=settings.headers(),
            timeout=httpx.Timeout(SHORT_TIMEOUT, connect=10.0),
            transport=transport,
            verify=ssl_context,
        ), settings.url)

    @property
    def http(self) -> httpx.Client:
        """This thread's client (created on first use)."""
        return self._pool.get()

    def close(self) -> None:
        self._pool.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise transport_error(exc, self.settings.url) from exc
        raise_for(response)
        return response

    def create(self, plan: dict[str, Any]) -> CreateResponse:
        r = self._request("POST", "/v1/environments", json={"plan": plan}, timeout=request_timeout(None))
        return CreateResponse.model_validate_json(r.content)

    def create_many(self, plan: dict[str, Any], count: int) -> list[CreateResponse]:
        r = self._request("POST", "/v1/environments", json={"plan": plan, "count": count},
                          timeout=request_timeout(None))
        return CreateGroupResponse.model_validate_json(r.content).environments

    def list(self) -> list[EnvironmentInfo]:
        return EnvironmentList.model_validate_json(self._request("GET", "/v1/environments").content).environments

    def info(self, env_id: str) -> EnvironmentInfo:
        return EnvironmentInfo.model_validate_json(self._request("GET", f"/v1/environments/{env_id}").content)

    def exec(self, env_id: str, request: ExecRequest) -> ExecResult:
        r = self._request(
            "POST",
            f"/v1/environments/{env_id}/exec",
            content=request.model_dump_json(exclude_none=True),
            headers={"content-type": "application/json"},
            timeout=request_timeout(request.timeout),
        )
        return ExecResult.model_validate_json(r.content)

    def exec_stream(self, env_id: str, request: ExecRequest) -> Iterator[ExecChunk]:
        with self._stream(env_id, request) as response:
            for line in response.iter_lines():
                if line.strip():
                    yield _chunk(line)

    @contextmanager
    def _stream(self, env_id: str, request: ExecRequest) -> Iterator[httpx.Response]:
        try:
            with self.http.stream(
                "POST",
                f"/v1/environments/{env_id}/exec/stream",
                content=request.model_dump_json(exclude_none=True),
                headers={"content-type": "application/json"},
                timeout=request_timeout(request.timeout),
            ) as response:
                if response.status_code >= 400:
                    raise error_of(response.status_code, response.read())
                yield response
        except httpx.TransportError as exc:
            raise transport_error(exc, self.settings.url) from exc

    def read_file(self, env_id: str, path: str) -> bytes:
        return self._request("GET", f"/v1/environments/{env_id}/files", params={"path": path}).content

    def write_file(self, env_id: str, path: str, data: bytes) -> None:
        self._request("PUT", f"/v1/environments/{env_id}/files", params={"path": path}, content=data)

    def diff(self, env_id: str, binary: str = "name") -> str:
        return self._request("GET", f"/v1/environments/{env_id}/diff", params={"binary": binary}).text

    def evaluate(self, env_id: str) -> Evaluation:
        r = self._request("POST", f"/v1/environments/{env_id}/evaluate", timeout=request_timeout(None))
        return Evaluation.model_validate_json(r.content)

    def stats(self, env_id: str) -> Stats:
        return Stats.model_validate_json(self._request("GET", f"/v1/environments/{env_id}/stats").content)

    def destroy(self, env_id: str) -> None:
        self._request("DELETE", f"/v1/environments/{env_id}", timeout=request_timeout(None))

    def health(self) -> Health:
        return Health.model_validate_json(self._request("GET", "/healthz").content)

    def metrics(self) -> dict[str, float]:
        return {}

    def metrics_text(self) -> str:
        return self._request("GET", "/metrics").text


def _chunk(line: str) -> ExecChunk:
    chunk = ExecChunk.model_validate(json.loads(line))
    if chunk.type == "error":
        raise from_dict(chunk.error or {"code": "internal_error", "message": "stream failed"})
    return chunk


class Client(EnvironmentFacade):
    """A node agent over HTTP. `url` defaults to $ROLLSTACK_NODE, `token` to $ROLLSTACK_TOKEN or the
    token file in the node's root."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        settings = Settings(token=token if token is not None else default_token())
        if url:
            settings.url = url
        self._service = HttpService(settings, transport)

    @property
    def url(self) -> str:
        return self._service.settings.url

    def close(self) -> None:
        self._service.close()
