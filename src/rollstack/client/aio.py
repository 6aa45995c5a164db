"""`AsyncClient` and `AsyncEnvironment`: the `Client` interface with async/await (httpx.AsyncClient).

    async with AsyncClient(url, token=...) as client:
        async with await client.create(plan) as env:
            r = await env.exec("pytest -q", timeout=60)
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import httpx

from rollstack.client._base import (
    SHORT_TIMEOUT,
    Settings,
    default_token,
    error_of,
    exec_request,
    plan_to_wire,
    raise_for,
    request_timeout,
    transport_error,
)
from rollstack.errors import from_dict
from rollstack.node.models import (
    CreateResponse,
    EnvironmentInfo,
    EnvironmentList,
    Evaluation,
    ExecChunk,
    ExecResult,
    Health,
    Stats,
)


class AsyncClient:
    """A node agent over HTTP, asynchronously. Same defaults as `Client`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = Settings(token=token if token is not None else default_token())
        if url:
            self.settings.url = url
        self.http = httpx.AsyncClient(
            base_url=self.settings.url,
            headers=self.settings.headers(),
            timeout=httpx.Timeout(SHORT_TIMEOUT, connect=10.0),
            transport=transport,
        )

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise transport_error(exc, self.settings.url) from exc
        raise_for(response)
        return response

    async def create(self, plan: Any) -> "AsyncEnvironment":
        r = await self._request(
            "POST", "/v1/environments", json={"plan": plan_to_wire(plan)}, timeout=request_timeout(None)
        )
        created = CreateResponse.model_validate_json(r.content)
        return AsyncEnvironment(self, created.id, created)

    async def get(self, env_id: str) -> "AsyncEnvironment":
        await self._request("GET", f"/v1/environments/{env_id}")
        return AsyncEnvironment(self, env_id)

    async def list(self) -> list[EnvironmentInfo]:
        r = await self._request("GET", "/v1/environments")
        return EnvironmentList.model_validate_json(r.content).environments

    async def health(self) -> Health:
        return Health.model_validate_json((await self._request("GET", "/healthz")).content)


class AsyncEnvironment:
    """One environment, async. `async with` always destroys it on exit."""

    def __init__(self, client: AsyncClient, env_id: str, created: CreateResponse | None = None):
        self._client = client
        self.id = env_id
        self.created = created

    def __repr__(self) -> str:
        return f"AsyncEnvironment({self.id!r})"

    async def __aenter__(self) -> "AsyncEnvironment":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    def _path(self, tail: str = "") -> str:
        return f"/v1/environments/{self.id}{tail}"

    async def exec(
        self,
        command: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        req = exec_request(command, timeout, cwd, env, stdin)
        r = await self._client._request(
            "POST",
            self._path("/exec"),
            content=req.model_dump_json(exclude_none=True),
            headers={"content-type": "application/json"},
            timeout=request_timeout(req.timeout),
        )
        return ExecResult.model_validate_json(r.content)

    async def exec_stream(
        self,
        command: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
    ) -> AsyncIterator[ExecChunk]:
        """Chunks of type `stdout`/`stderr` as they come, then one `result`."""
        req = exec_request(command, timeout, cwd, env, stdin)
        try:
            async with self._client.http.stream(
                "POST",
                self._path("/exec/stream"),
                content=req.model_dump_json(exclude_none=True),
                headers={"content-type": "application/json"},
                timeout=request_timeout(req.timeout),
            ) as response:
                if response.status_code >= 400:
                    raise error_of(response.status_code, await response.aread())
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    chunk = ExecChunk.model_validate(json.loads(line))
                    if chunk.type == "error":
                        raise from_dict(chunk.error or {"code": "internal_error"})
                    yield chunk
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client.settings.url) from exc

    async def read_file(self, path: str) -> bytes:
        return (await self._client._request("GET", self._path("/files"), params={"path": path})).content

    async def write_file(self, path: str, data: bytes | str) -> None:
        body = data.encode() if isinstance(data, str) else data
        await self._client._request("PUT", self._path("/files"), params={"path": path}, content=body)

    async def diff(self, binary: str = "name") -> str:
        return (await self._client._request("GET", self._path("/diff"), params={"binary": binary})).text

    async def evaluate(self) -> Evaluation:
        r = await self._client._request("POST", self._path("/evaluate"), timeout=request_timeout(None))
        return Evaluation.model_validate_json(r.content)

    async def stats(self) -> Stats:
        return Stats.model_validate_json((await self._client._request("GET", self._path("/stats"))).content)

    async def info(self) -> EnvironmentInfo:
        return EnvironmentInfo.model_validate_json((await self._client._request("GET", self._path())).content)

    async def destroy(self) -> None:
        await self._client._request("DELETE", self._path(), timeout=request_timeout(None))
