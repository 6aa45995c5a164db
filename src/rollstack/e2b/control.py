"""E2B's REST surface: the control plane (`/sandboxes`, `/v2/sandboxes`) and envd's `/files`
and `/health`, as a FastAPI app of its own (its errors are E2B's `{"code", "message"}`).

Control-plane routes authenticate with `X-API-KEY` (= the node's bearer token; `Authorization:
Bearer` works too). envd routes (`/files`, `/health`) are gated by the dispatcher
(rollstack.e2b.app: `E2b-Sandbox-Id` + `X-Access-Token`) before they get here.
Fork (the filesystem: docs/fork.md), pause, and resume by connect are rollstack's own.
`get_metrics` comes from the provisioner's samples; `create_snapshot(mode="filesystem")` is the
node's snapshot, `list_snapshots`/`delete_snapshot` the node store's, `update_network` the node's
`set_network`. Not supported (501): logs.
"""

from __future__ import annotations

import hmac
import logging
import zlib
from functools import partial
from datetime import datetime, timezone
from typing import Any, Callable, Literal, TypeVar
from urllib.parse import parse_qsl

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollstack.core.bodies import read_capped
from rollstack.e2b.models import (
    ConnectRequest,
    E2BError,
    ForkSandboxes,
    NetworkUpdate,
    NewSandbox,
    RefreshRequest,
    SnapshotSandbox,
    TimeoutRequest,
    WrittenFile,
)
from rollstack.e2b.sandboxes import SandboxTable
from rollstack.e2b.volumes import add_volume_routes
from rollstack.errors import InvalidRequest, NotFound, RollstackError, Unauthorized
from rollstack.contract.files import normalized as _abs, split_request
from rollstack.contract.service import NodeLocal

log = logging.getLogger(__name__)
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_MAX_FILE = 1 << 30
UNSUPPORTED = frozenset({"logs"})
"""E2B's routes under `/sandboxes/{id}/` that rollstack does not implement (501); any other is 404."""


def e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(E2BError(code=status, message=message).dump(), status_code=status, headers=headers)


def error_from(exc: BaseException) -> JSONResponse:
    if isinstance(exc, RollstackError):
        status = exc.status
        if exc.code == "insufficient_capacity":
            status = 429  # E2B's answer to "too many sandboxes"; the SDK backs off and retries
        return e2b_error(status, f"{exc.code}: {exc.message}" if exc.message else exc.code)
    log.error("E2B API call failed", exc_info=exc)
    return e2b_error(500, f"internal error: {type(exc).__name__}: {exc}")


async def _optional_body(request: Request, model: type[M], what: str) -> M:
    """The request's JSON body as `model`, its defaults when the body is empty (the SDK sends none)."""
    raw = await request.body()
    try:
        return model.model_validate_json(raw) if raw.strip() else model()
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {what} request: {exc.errors()[0].get('msg')}") from None


def create_control_app(table: SandboxTable, service: NodeLocal, token: str | None, threads: int = 64,
                       max_file: int = DEFAULT_MAX_FILE) -> FastAPI:
    """`max_file`: the largest file an upload may carry (the node's `max_file_bytes`)."""
    app = FastAPI(title="rollstack E2B-compatible API", docs_url=None, redoc_url=None, openapi_url=None,
                  responses={"default": {"model": E2BError, "description": "E2B's error body"}})
    limiter: dict[str, anyio.CapacityLimiter] = {}

    async def call(fn: Callable[..., T], *args: Any) -> T:
        if "l" not in limiter:
            limiter["l"] = anyio.CapacityLimiter(threads)
        return await anyio.to_thread.run_sync(partial(fn, *args), limiter=limiter["l"])

    async def api_key(request: Request) -> None:  # async: FastAPI runs a sync dependency in a thread
        if token is None:
            return
        given = request.headers.get("x-api-key", "")
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and not given:
            given = bearer.strip()
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            raise Unauthorized("missing or wrong X-API-KEY (the node's token)")

    auth = [Depends(api_key)]

    @app.exception_handler(RollstackError)
    async def _rollstack(_req: Request, exc: RollstackError) -> JSONResponse:
        return error_from(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return e2b_error(400, f"{loc or 'body'}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return e2b_error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        return error_from(exc)

    # -- control plane ----------------------------------------------------------------------

    async def create(req: NewSandbox, idempotency_key: str | None = Header(None, alias="Idempotency-Key")) -> JSONResponse:
        box = await call(table.create, req, idempotency_key)
        return JSONResponse(box.created().dump(), status_code=201)

    app.post("/v2/sandboxes", dependencies=auth, status_code=201)(create)
    app.post("/sandboxes", dependencies=auth, status_code=201)(create)

    async def list_sandboxes(metadata: str | None = Query(None),
                             state: str | None = Query(None, max_length=64),
                             started_after: str | None = Query(None, alias="startedAfter", max_length=64),
                             template: str | None = Query(None, max_length=512),
                             order: Literal["asc", "desc"] = Query("asc"),
                             limit: int | None = Query(None, ge=1, le=10_000),
                             next_token: str | None = Query(None, alias="nextToken", max_length=12)) -> JSONResponse:
        """`Sandbox.list(query=SandboxQuery(metadata, state, started_after, template), limit=)`:
        pages of `limit` (all at once without), `x-next-token` (an offset) naming the next."""
        wanted = dict(parse_qsl(metadata, keep_blank_values=True)) if metadata else None
        states = {s.strip() for s in state.split(",") if s.strip()} if state else None
        if states is not None and not states <= {"running", "paused"}:
            raise InvalidRequest(f"state: running or paused, not {sorted(states - {'running', 'paused'})}")
        boxes = await call(table.list, wanted, states, _instant(started_after), template, order == "desc")
        return _page([b.listed().dump() for b in boxes], limit, next_token)

    app.get("/v2/sandboxes", dependencies=auth)(list_sandboxes)
    app.get("/sandboxes", dependencies=auth)(list_sandboxes)

    @app.get("/sandboxes/{sandbox_id}", dependencies=auth)
    async def get_sandbox(sandbox_id: str) -> JSONResponse:
        return JSONResponse((await call(table.get, sandbox_id)).detail().dump())

    @app.post("/sandboxes/{sandbox_id}/refreshes", dependencies=auth, status_code=204)
    async def refresh(sandbox_id: str, request: Request) -> Response:
        """Keep-alive: the sandbox lives at least `duration` s (default 15) more."""
        req = await _optional_body(request, RefreshRequest, "refresh")
        await call(table.refresh, sandbox_id, req.duration)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/timeout", dependencies=auth, status_code=204)
    async def set_timeout(sandbox_id: str, req: TimeoutRequest) -> Response:
        await call(table.set_timeout, sandbox_id, req.timeout)
        return Response(status_code=204)

    async def connect(sandbox_id: str, request: Request) -> JSONResponse:
        return await _connect(sandbox_id, request, 200)

    async def _connect(sandbox_id: str, request: Request, status: int) -> JSONResponse:
        req = await _optional_body(request, ConnectRequest, "connect")
        box = await call(table.resume, sandbox_id)  # a paused sandbox is resumed by a connect
        if req.timeout is not None:
            box = await call(table.set_timeout, sandbox_id, req.timeout)
        return JSONResponse(box.created().dump(), status_code=status)

    @app.post("/sandboxes/{sandbox_id}/resume", dependencies=auth, status_code=201)
    async def resume(sandbox_id: str, request: Request) -> JSONResponse:
        """The older name of a connect to a paused sandbox (201, as E2B answers it)."""
        return await _connect(sandbox_id, request, 201)

    @app.get("/sandboxes/{sandbox_id}/metrics", dependencies=auth)
    async def metrics(sandbox_id: str, start: int | None = Query(None, ge=0, le=2**40),
                      end: int | None = Query(None, ge=0, le=2**40)) -> JSONResponse:
        """`Sandbox.get_metrics`: CPU and memory samples of the node's provisioner."""
        return JSONResponse(await call(table.metrics, sandbox_id, start, end))

    @app.post("/sandboxes/{sandbox_id}/snapshots", dependencies=auth, status_code=201)
    async def snapshot(sandbox_id: str, request: Request) -> JSONResponse:
        """`create_snapshot(mode="filesystem")`: a published plan `Sandbox.create` starts from."""
        req = await _optional_body(request, SnapshotSandbox, "snapshot")
        return JSONResponse(await call(table.snapshot, sandbox_id, req.name, req.memory), status_code=201)

    @app.get("/snapshots", dependencies=auth)
    async def list_snapshots(sandbox_id: str | None = Query(None, alias="sandboxID", max_length=64),
                             name: str | None = Query(None, max_length=256),
                             limit: int = Query(100, ge=1, le=1000),
                             next_token: str | None = Query(None, alias="nextToken", max_length=12)) -> JSONResponse:
        """`Sandbox.list_snapshots`: pages of `limit`; `x-next-token` (an offset) names the next."""
        return _page(await call(table.snapshots, sandbox_id, name), limit, next_token)

    @app.delete("/templates/{template_id:path}", dependencies=auth, status_code=204)
    async def delete_snapshot(template_id: str) -> Response:
        """`Sandbox.delete_snapshot(id)` (E2B deletes snapshots as templates); only snapshots
        are deleted here: a template that is no snapshot is 404."""
        if not await call(table.delete_snapshot, template_id):
            return e2b_error(404, f"snapshot {template_id!r} was not found")
        return Response(status_code=204)

    @app.put("/sandboxes/{sandbox_id}/network", dependencies=auth, status_code=204)
    async def update_network(sandbox_id: str, request: Request) -> Response:
        """`Sandbox.update_network`: the whole egress configuration replaced (E2B's semantics: a
        field left out is back at its default), on a sandbox created with a network."""
        body = await _optional_body(request, NetworkUpdate, "network")
        await call(table.update_network, sandbox_id, body.policy())
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/pause", dependencies=auth, status_code=204)
    async def pause(sandbox_id: str) -> Response:
        await call(table.pause, sandbox_id)
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/fork", dependencies=auth, status_code=201)
    async def fork(sandbox_id: str, request: Request) -> JSONResponse:
        req = await _optional_body(request, ForkSandboxes, "fork")
        boxes = await call(table.fork, sandbox_id, req.count, req.timeout)
        return JSONResponse([{"sandbox": b.created().dump()} for b in boxes], status_code=201)

    app.post("/v2/sandboxes/{sandbox_id}/connect", dependencies=auth)(connect)
    app.post("/sandboxes/{sandbox_id}/connect", dependencies=auth)(connect)

    @app.delete("/sandboxes/{sandbox_id}", dependencies=auth, status_code=204)
    async def kill(sandbox_id: str) -> Response:
        await call(table.kill, sandbox_id)
        return Response(status_code=204)

    @app.api_route("/sandboxes/{sandbox_id}/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"], dependencies=auth,
                   include_in_schema=False)
    async def unsupported(sandbox_id: str, rest: str) -> JSONResponse:
        feature = rest.split("/")[0]
        if feature not in UNSUPPORTED:  # not an E2B route at all: no such thing, not "not implemented"
            raise StarletteHTTPException(404, f"no route /sandboxes/{{sandbox_id}}/{feature}")
        return e2b_error(501, f"{feature!r} is not supported by rollstack (see docs/e2b.md)")

    add_volume_routes(app, service, token, auth, call, max_file)

    # -- envd HTTP: /health, /files ---------------------------------------------------------

    @app.get("/health", status_code=204)
    async def health() -> Response:
        return Response(status_code=204)

    def box_of(request: Request) -> str:
        box = table.peek(request.headers.get("e2b-sandbox-id", ""))
        if box is None:  # the dispatcher checked it; it ended in between
            raise NotFound("sandbox was not found")
        return box.id

    @app.get("/files", response_class=Response, responses={200: {"description": "the file's bytes", "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def read_file(request: Request, path: str = Query(..., min_length=1)) -> Response:
        sandbox_id = box_of(request)
        split_request(path)
        data = await call(service.read_file, sandbox_id, _abs(path))
        return Response(data, media_type="application/octet-stream")

    @app.post("/files", response_model=list[WrittenFile], openapi_extra={"requestBody": {"required": False, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "multipart/form-data": {"schema": {"type": "object", "properties": {
            "file": {"type": "string", "format": "binary"}}}}}}})
    async def write_files(request: Request, path: str | None = Query(None)) -> JSONResponse:
        sandbox_id = box_of(request)
        if any(k.lower().startswith("x-metadata-") for k in request.headers):
            raise InvalidRequest("file metadata is not supported")
        ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        body = await read_capped(request, max_file + (1 << 20))
        if request.headers.get("content-encoding", "").lower() == "gzip":
            body = _gunzip(body, max_file)
        files: list[tuple[str, bytes]] = []
        if ctype == "multipart/form-data":
            files = await _multipart(request, body, path)
        else:
            if not path:
                raise InvalidRequest("an octet-stream upload needs ?path=")
            files = [(path, body)]
        out = []
        for name, data in files:
            split_request(name)
            await call(service.write_file, sandbox_id, _abs(name), data)
            target = _abs(name)
            out.append(WrittenFile(name=target.rsplit("/", 1)[-1], path=target).dump())
        return JSONResponse(out)

    return app


def _instant(value: str | None) -> datetime | None:
    """An RFC 3339 / ISO 8601 time (UTC when it names no zone), else InvalidRequest."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"startedAfter: not an RFC 3339 time: {value[:40]!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _page(items: list[Any], limit: int | None, next_token: str | None) -> JSONResponse:
    """One page of `items` from offset `next_token`; `x-next-token` names the next if any."""
    if next_token is not None and not (next_token.isascii() and next_token.isdigit()):
        raise InvalidRequest("nextToken: not a token this node handed out")
    start = int(next_token or 0)
    end = len(items) if limit is None else start + limit
    more = end < len(items)
    return JSONResponse(items[start:end], headers={"x-next-token": str(end)} if more else None)


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"the body is not valid gzip: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise InvalidRequest("the decompressed upload exceeds the files API limit")
    return out


async def _multipart(request: Request, body: bytes, path: str | None) -> list[tuple[str, bytes]]:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(request.scope, replay).form(max_files=1000, max_fields=1000)
    try:
        uploads = [v for _, v in form.multi_items() if not isinstance(v, str)]
        if not uploads:
            raise InvalidRequest("the multipart upload holds no file")
        if len(uploads) == 1 and path:
            return [(path, await uploads[0].read())]
        out = []
        for up in uploads:
            if not up.filename:
                raise InvalidRequest("each uploaded file needs its path as filename")
            out.append((up.filename, await up.read()))
        return out
    finally:
        await form.close()

