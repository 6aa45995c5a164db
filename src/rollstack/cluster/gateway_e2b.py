"""The E2B-compatible API for a whole pool, on the gateway's listen address.

Point the unmodified `e2b` SDK at the gateway (`E2B_API_URL` = `E2B_SANDBOX_URL` = its URL,
`E2B_API_KEY` = its token) and sandboxes spread over the pool's nodes:

- `POST /sandboxes` (and `/v2/sandboxes`) places like `Pool.create` (the template's published
  plan read from the cluster's store -> stack, trace key, resources) and creates on the chosen
  node; a node that answers 429 (`insufficient_capacity`) or cannot be reached is skipped, the
  next best is tried; a full pool answers 429 naming the pool;
- `GET /sandboxes` (and `/v2/...`) concatenates the nodes' lists;
- every other control-plane call (`/sandboxes/{id}...`) goes to the node holding that sandbox,
  with the node's own token;
- envd calls (the Connect services `/process.Process/*`, `/filesystem.Filesystem/*`, and
  `/files`, `/health`) name their sandbox in `E2b-Sandbox-Id`: forwarded to its node with their
  headers (the envd access token) unchanged. Request and response bodies are relayed chunk by
  chunk, so Connect server streams (command output) stream through the gateway.

The sandbox id is the node's environment id, so the only state is id -> node, rebuilt from the
nodes' `GET /v1/node` env ids when an id is unknown (a gateway restart loses no sandbox). An
unknown sandbox, or one whose node is gone, is answered like E2B's edge proxy (502, "... was not
found"; the SDK raises SandboxNotRunningException) on envd paths and 404 on control paths.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

import anyio.to_thread
import httpx
from pydantic import ValidationError

from rollstack.errors import NodeUnavailable, RollstackError

log = logging.getLogger(__name__)

_CONNECT_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
_ENVD_HTTP = ("/files", "/health")
_COLLECTIONS = ("/sandboxes", "/v2/sandboxes")
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
        "proxy-authorization", "proxy-connection"}


def is_control(path: str) -> bool:
    return path in _COLLECTIONS or path.startswith(("/sandboxes/", "/v2/sandboxes/"))


def is_envd(path: str) -> bool:
    return path.startswith(_CONNECT_PREFIXES) or path in _ENVD_HTTP


class E2BGateway:
    """ASGI middleware on the gateway app: E2B paths here, the rest to the wrapped app."""

    def __init__(self, app: Any, pool: Any, token: str | None) -> None:
        self.app, self.pool, self.token = app, pool, token
        self.owner: dict[str, str] = {}
        self._http: httpx.AsyncClient | None = None

    # -- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (is_control(path) or is_envd(path)):
            if scope["type"] == "lifespan":
                await self._lifespan(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if is_envd(path):
                await self._envd(scope, receive, tracked, headers)
            else:
                await self._control(scope, receive, tracked, headers, path)
        except Exception as exc:  # noqa: BLE001 - answered E2B-style, never a traceback to the client
            if isinstance(exc, RollstackError):
                status = 429 if exc.code == "insufficient_capacity" else exc.status
                message = f"{exc.code}: {exc.message}"
            else:
                log.exception("E2B gateway call %s %s failed", scope.get("method"), path)
                status, message = 500, f"internal error: {type(exc).__name__}: {exc}"
            if started:  # a relayed stream broke half way: nothing more can be said
                raise
            await _json(send, status, {"code": status, "message": message})

    async def _lifespan(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def closing_send(message: dict[str, Any]) -> None:
            if message["type"].startswith("lifespan.shutdown") and self._http is not None:
                await self._http.aclose()
                self._http = None
            await send(message)

        await self.app(scope, receive, closing_send)

    # -- control plane ------------------------------------------------------------------------
    async def _control(self, scope: dict[str, Any], receive: Any, send: Any, headers: dict[str, str],
                       path: str) -> None:
        if not self._api_key_ok(headers):
            await _json(send, 401, {"code": 401, "message": "missing or wrong X-API-KEY (the gateway's token)"})
            return
        method = scope["method"]
        if path in _COLLECTIONS and method == "POST":
            await self._create(scope, receive, send, headers)
            return
        if path in _COLLECTIONS and method == "GET":
            await self._list(scope, send, headers)
            return
        sandbox_id = path.split("/")[3 if path.startswith("/v2/") else 2]
        node_id = await self._locate(sandbox_id)
        if node_id is None:
            await _json(send, 404, {"code": 404, "message": f"sandbox {sandbox_id} not found"})
            return
        await self._forward(node_id, scope, receive, send, self._control_headers(headers, node_id), sandbox_id)

    async def _create(self, scope: dict[str, Any], receive: Any, send: Any, headers: dict[str, str]) -> None:
        from rollstack.e2b.models import NewSandbox

        body = await _body(receive)
        try:
            template = NewSandbox.model_validate_json(body or b"{}").template_id
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            await _json(send, 400, {"code": 400, "message": f"{where}: {first.get('msg', 'invalid request')}"})
            return
        core = self.pool._core  # noqa: SLF001 - the gateway is the pool's own front end
        req = await anyio.to_thread.run_sync(core.placer.request_template, template)
        excluded: set[str] = set()
        while True:
            node_id, record = core.choose(req, excluded)  # InsufficientCapacity naming the pool: 429
            core.directory.reserve(node_id, req)
            ok = False
            try:
                m = core.directory.member(node_id)
                try:
                    r = await self._client().post(m.url + scope["path"], content=body,
                                                  headers=self._control_headers(headers, node_id))
                except httpx.TransportError:
                    core.directory.mark_dead(node_id)
                    excluded.add(node_id)
                    continue
                if r.status_code == 429:  # the node is full after all: the next best
                    excluded.add(node_id)
                    continue
                ok = r.status_code == 201
            finally:
                core.directory.release(node_id, req, created=ok)
            if ok:
                record["created"] = True
                self.owner[r.json()["sandboxID"]] = node_id
            await _respond(send, r.status_code, r.headers, r.content)
            return

    async def _list(self, scope: dict[str, Any], send: Any, headers: dict[str, str]) -> None:
        out: list[Any] = []
        for m in list(self.pool.directory.members.values()):
            if not m.alive:
                continue
            url = m.url + scope["path"] + (("?" + scope["query_string"].decode()) if scope.get("query_string") else "")
            try:
                r = await self._client().get(url, headers=self._control_headers(headers, m.node_id))
            except httpx.TransportError:
                self.pool.directory.mark_dead(m.node_id)
                continue
            if r.status_code != 200:
                await _respond(send, r.status_code, r.headers, r.content)
                return
            for box in r.json():
                self.owner[box["sandboxID"]] = m.node_id
                out.append(box)
        await _json(send, 200, out)

    # -- envd ---------------------------------------------------------------------------------
    async def _envd(self, scope: dict[str, Any], receive: Any, send: Any, headers: dict[str, str]) -> None:
        sandbox_id = headers.get("e2b-sandbox-id", "")
        if not sandbox_id:
            await _json(send, 400, {"code": 400, "message": "the E2b-Sandbox-Id header is required"})
            return
        node_id = await self._locate(sandbox_id)
        if node_id is None:
            await _json(send, 502, {"code": 502, "message": f"The sandbox {sandbox_id} was not found"})
            return
        fwd = {k: v for k, v in headers.items() if k not in _HOP and k != "content-length"}
        await self._forward(node_id, scope, receive, send, fwd, sandbox_id)

    # -- plumbing -----------------------------------------------------------------------------
    async def _forward(self, node_id: str, scope: dict[str, Any], receive: Any, send: Any,
                       headers: dict[str, str], sandbox_id: str) -> None:
        """Relay one request to `node_id` and its response back, both chunk by chunk."""
        m = self.pool.directory.member(node_id)
        if m is None:
            self.owner.pop(sandbox_id, None)
            raise NodeUnavailable(f"the node of sandbox {sandbox_id} left the pool", node=node_id)
        url = m.url + scope["path"] + (("?" + scope["query_string"].decode()) if scope.get("query_string") else "")
        raw = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        headers = dict(headers)
        if "content-length" in raw:  # a sized body stays sized; a chunked one is relayed chunked
            headers["content-length"] = raw["content-length"]
        has_body = "content-length" in raw or "transfer-encoding" in raw
        req = self._client().build_request(scope["method"], url, headers=headers,
                                           content=_stream(receive) if has_body else None)
        try:
            resp = await self._client().send(req, stream=True)
        except httpx.TransportError as exc:
            self.pool.directory.mark_dead(node_id)
            self.owner.pop(sandbox_id, None)
            await _json(send, 502, {"code": 502, "message": f"The sandbox {sandbox_id} was not found "
                                                            f"(its node {node_id} was lost: {exc})"})
            return
        try:
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.multi_items()
                                    if k.lower() not in _HOP]})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()
        if scope["method"] == "DELETE" and resp.status_code < 300:
            self.owner.pop(sandbox_id, None)

    async def _locate(self, sandbox_id: str) -> str | None:
        node_id = self.owner.get(sandbox_id)
        if node_id is not None:
            return node_id
        await anyio.to_thread.run_sync(self.pool.directory.poll)  # rebuild from the nodes' own lists
        for m in list(self.pool.directory.members.values()):
            for eid in (m.info or {}).get("env_ids", []) if m.alive else ():
                self.owner[eid] = m.node_id
        return self.owner.get(sandbox_id)

    def _api_key_ok(self, headers: dict[str, str]) -> bool:
        if self.token is None:
            return True
        given = headers.get("x-api-key", "")
        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and not given:
            given = bearer.strip()
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def _control_headers(self, headers: dict[str, str], node_id: str) -> dict[str, str]:
        m = self.pool.directory.member(node_id)
        out = {k: v for k, v in headers.items()
               if k not in _HOP and k not in ("content-length", "x-api-key", "authorization")}
        if m is not None and m.token:
            out["x-api-key"] = m.token
        return out

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        return self._http


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _stream(receive: Any):  # the request body, as it arrives
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body"):
            return


async def _respond(send: Any, status: int, headers: httpx.Headers, body: bytes) -> None:
    ctype = headers.get("content-type", "application/json")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype.encode("latin-1")), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _json(send: Any, status: int, doc: Any) -> None:
    await _respond(send, status, httpx.Headers({"content-type": "application/json"}), json.dumps(doc).encode())
