"""The node agent's HTTP API (FastAPI): routes of interface.md over an `EnvironmentService`.

- Bearer-token auth on every route but `/healthz` (401 with the error body otherwise).
- Every error is `{"error": {"code", "message"}}` with the error class's HTTP status; request
  validation errors are `invalid_request` (400) in that same body, never FastAPI's default.
- Service calls block (runc, mounts, disk); they run in worker threads under the app's own
  capacity limiter, sized for many concurrent environments (anyio's default of 40 is too few for
  64 environments each with an exec in flight).
"""

from __future__ import annotations

import hmac
import logging
import time
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Literal, TypeVar

import anyio
import anyio.to_thread
from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rollstack.core.bodies import read_capped
from rollstack.errors import InternalError, InvalidRequest, RollstackError, Unauthorized
from rollstack.contract.models import (
    CreateGroupResponse,
    ForkRequest,
    PauseRequest,
    NetworkRequest,
    Snapshot,
    SnapshotInfo,
    SnapshotRequest,
    VolumeInfo,
    VolumeRequest,
    CreateRequest,
    CreateResponse,
    EnvironmentInfo,
    EnvironmentList,
    ErrorBody,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    LeaseRenewal,
    LeaseRequest,
    NodeInfo,
    RenewRequest,
    Stats,
)
from rollstack.contract import routes as R
from rollstack.contract.service import EnvironmentService

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_THREADS = 256
"""Worker threads for blocking service calls (a parked exec holds one for its whole run)."""

_ERRORS: dict[int | str, dict[str, Any]] = {"default": {"model": ErrorBody, "description": "error"}}
_RAW_BODY = {"requestBody": {"required": False, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
"""The files API's upload: raw bytes (read from the request, not a model)."""


def _raw(status: int, media_type: str) -> dict[int | str, dict[str, Any]]:
    """A route's non-JSON answer. Documented here rather than by `response_class`, which would
    make FastAPI document the route's JSON error answers in that media type too."""
    return {status: {"description": "raw body", "content": {media_type: {"schema": {"type": "string"}}}}}


def create_app(
    service: EnvironmentService,
    token: str | None,
    threads: int = DEFAULT_THREADS,
    max_body: int = 1 << 30,
    e2b: bool = True,
) -> FastAPI:
    """The API over `service`. `token=None` disables auth (in-process tests only)."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state["limiter"] = anyio.CapacityLimiter(threads)
        yield

    def limiter() -> anyio.CapacityLimiter:
        if "limiter" not in state:  # lifespan not run (e.g. a bare ASGI transport in tests)
            state["limiter"] = anyio.CapacityLimiter(threads)
        return state["limiter"]

    app = FastAPI(
        title="rollstack node agent",
        version="1",
        lifespan=lifespan,
        responses=_ERRORS,
    )
    metrics = _Metrics(service)

    async def offload(fn: Callable[[], T]) -> T:
        """A blocking call in the app's worker threads."""
        return await anyio.to_thread.run_sync(fn, limiter=limiter())

    async def timed(op: str, call: Awaitable[T]) -> T:
        start = time.perf_counter()
        try:
            return await call
        finally:
            metrics.observe(op, time.perf_counter() - start)

    async def call(op: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await timed(op, offload(partial(fn, *args, **kwargs)))

    async def authorize(request: Request) -> None:  # async: FastAPI runs a sync dependency in a thread
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise Unauthorized("missing or wrong bearer token")

    _install_error_handlers(app)
    auth = [Depends(authorize)]

    def route(r: R.Route, **kw: Any) -> Callable[[Any], Any]:
        """Serve the contract's route `r` (rollstack.contract.routes)."""
        return app.api_route(r.template, methods=[r.method], **kw)

    @route(R.HEALTH, response_model=Health)
    async def healthz() -> Health:
        return await call("health", service.health)

    @route(R.NODE, dependencies=auth, response_model=NodeInfo)
    async def node() -> NodeInfo:
        from rollstack.node.info import node_info

        return await call("node", node_info, service)

    @route(R.METRICS, dependencies=auth, response_class=Response, responses=_raw(200, "text/plain"))
    async def prometheus() -> Response:
        body, content_type = await call("metrics", metrics.render)
        return Response(body, media_type=content_type)

    @route(R.CREATE, dependencies=auth, status_code=201,
           response_model=CreateResponse | CreateGroupResponse)
    async def create(req: CreateRequest, idempotency_key: str | None = Header(
            None, alias="Idempotency-Key", description="a retry with the same key returns the same environment(s)"),
    ) -> CreateResponse | CreateGroupResponse:
        # Only what the request carries is passed: a service without leases or keys still serves.
        options = {k: v for k, v in (("lease", req.lease), ("idempotency_key", idempotency_key)) if v is not None}
        if req.count is None:
            return await call("create", service.create, req.plan, **options)
        created = await call("create", service.create_many, req.plan, req.count, **options)
        return CreateGroupResponse(environments=created)

    @route(R.FORK, dependencies=auth, status_code=201, response_model=CreateGroupResponse)
    async def fork(env_id: str, req: ForkRequest | None = Body(None), idempotency_key: str | None = Header(
            None, alias="Idempotency-Key", description="a retry with the same key returns the same children"),
    ) -> CreateGroupResponse:
        """`count` new environments whose filesystem is this one's now (docs/fork.md)."""
        req = req or ForkRequest()
        options = {"idempotency_key": idempotency_key} if idempotency_key is not None else {}
        return CreateGroupResponse(environments=await call("fork", service.fork, env_id, req.count, req.lease, **options))

    @route(R.PAUSE, dependencies=auth, response_model=EnvironmentInfo)
    async def pause(env_id: str, req: PauseRequest | None = Body(None)) -> EnvironmentInfo:
        """Freeze its processes (or checkpoint them to disk) and give its quotas back to
        admission (docs/fork.md)."""
        return await call("pause", service.pause, env_id, (req or PauseRequest()).mode)

    @route(R.RESUME, dependencies=auth, response_model=EnvironmentInfo)
    async def resume(env_id: str) -> EnvironmentInfo:
        return await call("resume", service.resume, env_id)

    @route(R.SNAPSHOT, dependencies=auth, status_code=201, response_model=Snapshot)
    async def snapshot(env_id: str, req: SnapshotRequest) -> Snapshot:
        """Publish its filesystem now as a plan any node sharing the store starts from."""
        return await call("snapshot", service.snapshot, env_id, req.name)

    @route(R.NETWORK, dependencies=auth, response_model=EnvironmentInfo)
    async def set_network(env_id: str, req: NetworkRequest) -> EnvironmentInfo:
        """Replace its egress policy now (its network namespace's nftables table, atomically)."""
        return await call("set_network", service.set_network, env_id, req.network)

    @route(R.SNAPSHOTS, dependencies=auth, response_model=list[SnapshotInfo])
    async def snapshots(source: str | None = Query(None, max_length=64)) -> list[SnapshotInfo]:
        """The snapshots in the node's store (of environment `source` only, if given)."""
        return await call("snapshots", service.snapshots, source)

    @route(R.DELETE_SNAPSHOT, dependencies=auth, status_code=204, response_class=Response)
    async def delete_snapshot(name: str = Query(..., min_length=3, max_length=256)) -> Response:
        """Remove snapshot `name` (NAME:TAG): its plan, then its group."""
        await call("delete_snapshot", service.delete_snapshot, name)
        return Response(status_code=204)

    @route(R.CREATE_VOLUME, dependencies=auth, response_model=VolumeInfo, status_code=201)
    async def create_volume(req: VolumeRequest) -> VolumeInfo:
        """A new, empty volume that plans mount by name (`volumes: [{name, path}]`)."""
        return await call("create_volume", service.create_volume, req.name)

    @route(R.VOLUMES, dependencies=auth, response_model=list[VolumeInfo])
    async def volumes() -> list[VolumeInfo]:
        """The node's volumes and the environments mounting each."""
        return await call("volumes", service.volumes)

    @route(R.DELETE_VOLUME, dependencies=auth, status_code=204, response_class=Response)
    async def delete_volume(name: str) -> Response:
        """Remove a volume and its files (`volume_busy` while an environment mounts it)."""
        await call("delete_volume", service.delete_volume, name)
        return Response(status_code=204)

    @route(R.READ_VOLUME_FILE, dependencies=auth, response_class=Response,
           responses=_raw(200, "application/octet-stream"))
    async def read_volume_file(name: str, path: str = Query(..., min_length=1)) -> Response:
        data = await call("read_volume_file", service.read_volume_file, name, path)
        return Response(data, media_type="application/octet-stream")

    @route(R.WRITE_VOLUME_FILE, dependencies=auth, status_code=204, openapi_extra=_RAW_BODY)
    async def write_volume_file(name: str, request: Request, path: str = Query(..., min_length=1)) -> Response:
        data = await read_capped(request, max_body)
        await call("write_volume_file", service.write_volume_file, name, path, data)
        return Response(status_code=204)

    @route(R.RENEW, dependencies=auth, response_model=LeaseRenewal)
    async def renew(req: RenewRequest) -> LeaseRenewal:
        """Renew many environments' leases in one request; unknown or ended ids are `missing`."""
        return await call("renew", service.renew, req.ids, req.lease)

    @route(R.RENEW_ONE, dependencies=auth, response_model=LeaseRenewal)
    async def renew_one(env_id: str, req: LeaseRequest | None = Body(None)) -> LeaseRenewal:
        renewal = await call("renew", service.renew, [env_id], req.lease if req else None)
        if renewal.missing:
            from rollstack.errors import EnvironmentNotFound

            raise EnvironmentNotFound(f"no live environment {env_id!r}")
        return renewal

    @route(R.LIST, dependencies=auth, response_model=EnvironmentList)
    async def list_environments() -> EnvironmentList:
        return EnvironmentList(environments=await call("list", service.list))

    @route(R.INFO, dependencies=auth, response_model=EnvironmentInfo)
    async def info(env_id: str) -> EnvironmentInfo:
        return await call("info", service.info, env_id)

    @route(R.DESTROY, dependencies=auth, status_code=204)
    async def destroy(env_id: str) -> Response:
        await call("destroy", service.destroy, env_id)
        return Response(status_code=204)

    @route(R.EXEC, dependencies=auth, response_model=ExecResult)
    async def exec_(env_id: str, req: ExecRequest) -> ExecResult:
        return await timed("exec", service.exec_async(env_id, req, offload))  # the node's: on this loop

    @route(
        R.EXEC_STREAM,
        dependencies=auth,
        response_class=StreamingResponse,
        responses={200: {"content": {"application/x-ndjson": {}}, "description": "ExecChunk lines"}},
    )
    async def exec_stream(env_id: str, req: ExecRequest) -> StreamingResponse:
        # Open the stream before answering so that an unknown id is a plain 404, not a 200
        # whose first line is an error.
        chunks = await call("exec_stream", service.exec_stream, env_id, req)
        first = await call("exec_stream", _next_or_none, chunks)
        return StreamingResponse(
            _ndjson(first, chunks, limiter()), media_type="application/x-ndjson"
        )

    @route(R.READ_FILE, dependencies=auth, response_class=Response,
           responses=_raw(200, "application/octet-stream"))
    async def read_file(env_id: str, path: str = Query(..., min_length=1)) -> Response:
        data = await call("read_file", service.read_file, env_id, path)
        return Response(data, media_type="application/octet-stream")

    @route(R.WRITE_FILE, dependencies=auth, status_code=204, openapi_extra=_RAW_BODY)
    async def write_file(env_id: str, request: Request, path: str = Query(..., min_length=1)) -> Response:
        data = await read_capped(request, max_body)
        await call("write_file", service.write_file, env_id, path, data)
        return Response(status_code=204)

    @route(R.DIFF, dependencies=auth, response_class=Response,
           responses=_raw(200, "text/plain"))
    async def diff(env_id: str, binary: Literal["name", "patch"] = "name") -> PlainTextResponse:
        return PlainTextResponse(await call("diff", service.diff, env_id, binary))

    @route(R.EVALUATE, dependencies=auth, response_model=Evaluation)
    async def evaluate(env_id: str) -> Evaluation:
        return await call("evaluate", service.evaluate, env_id)

    @app.api_route(R.PORT, dependencies=auth,
                   include_in_schema=False,  # one route, many methods: not an OpenAPI operation
                   methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def port_proxy(env_id: str, port: int, path: str, request: Request) -> Response:
        from rollstack.node import ports

        base = await call("port", service.port_target, env_id, port)
        return await ports.proxy(base, env_id, port, request)  # streamed both ways

    @route(R.STATS, dependencies=auth, response_model=Stats)
    async def stats(env_id: str) -> Stats:
        return await call("stats", service.stats, env_id)

    if e2b:  # the E2B-compatible API beside /v1 (rollstack.e2b; docs/e2b.md)
        from rollstack.e2b import install

        install(app, service, token)
    return app


_DONE = object()


def _next_or_none(it: Iterator[ExecChunk]) -> Any:
    return next(it, _DONE)


async def _ndjson(first: Any, chunks: Iterator[ExecChunk], limiter: anyio.CapacityLimiter) -> AsyncIterator[bytes]:
    item = first
    try:
        while item is not _DONE:
            yield (item.model_dump_json(exclude_none=True) + "\n").encode()
            item = await anyio.to_thread.run_sync(_next_or_none, chunks, limiter=limiter)
    except RollstackError as exc:  # headers are gone: the error becomes the last line
        yield (ExecChunk(type="error", error=exc.to_dict()).model_dump_json(exclude_none=True) + "\n").encode()
    except Exception as exc:  # noqa: BLE001 - never cut a stream without saying why
        log.exception("exec stream failed")
        err = InternalError(f"{type(exc).__name__}: {exc}")
        yield (ExecChunk(type="error", error=err.to_dict()).model_dump_json(exclude_none=True) + "\n").encode()
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            await anyio.to_thread.run_sync(close, limiter=limiter)


def error_response(err: RollstackError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(err, Unauthorized) else None
    return JSONResponse({"error": err.to_dict()}, status_code=err.status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RollstackError)
    async def _rollstack(_req: Request, exc: RollstackError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(InvalidRequest(_describe_validation(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = {"error": {"code": code, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in the node API")
        return error_response(InternalError(f"{type(exc).__name__}: {exc}"))


def _describe_validation(errors: Any) -> str:
    parts = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


class _Metrics:
    """Prometheus metrics of one app: request latency by operation, and the service's gauges."""

    def __init__(self, service: EnvironmentService) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "rollstack_api_seconds",
            "Node API call latency by operation",
            ["op"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.registry.register(_ServiceCollector(service))

    def observe(self, op: str, seconds: float) -> None:
        self.latency.labels(op).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ServiceCollector:
    def __init__(self, service: EnvironmentService) -> None:
        self.service = service

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            values = self.service.metrics()
        except Exception:  # noqa: BLE001 - a scrape must not fail because a gauge did
            log.exception("service metrics failed")
            return
        for name, value in sorted(values.items()):
            yield GaugeMetricFamily(f"rollstack_{name}", name.replace("_", " "), value=float(value))
