"""The daemon's control API: small HTTP/1.1 (h11) on trio, over a unix socket and optionally TCP.

JSON in, JSON out; errors as `{"error": {"code", "message"}}` with the error's HTTP status.
Routes are one table (`ROUTES`), request bodies pydantic models (lazystore/wire.py): a body that
does not fit its model is `invalid_request` (400) naming the field.

    GET  /healthz                      {"ok": true, "mountpoint": ...}
    POST /v1/layers                    {"layers": [{repo, digest}]} -> add_layers timings
    POST /v1/fetch_all                 {"layers": [...], "background": bool} -> {"seconds", "fetched_bytes", "stack_bytes"}
    POST /v1/envs/<id>                 {"layers": [...], "trace_key": k|null, "fallback_key": k|null, "background": bool}
    POST /v1/envs                      {"ids": [id, ...], + the fields above} -> begin a group at once
                                       (1..256 unique ids; layers added and local traces read once)
    GET  /v1/envs/<id>                 env stats
    DELETE /v1/envs/<id>               end env -> final stats
    POST /v1/envs/<id>/trace           {"keys": [k, ...]} -> {"chunks": n}: what the env read so far
                                       (its recording, else its task's trace) saved and shared as `keys`
    POST /v1/prefetch                  {"trace_key": k, "env_id": id|null} -> prefetch a stored trace
    GET  /v1/stats                     node-wide stats
    GET  /v1/chunks/<digest>[?wait=S[&stage=registry]]  chunk bytes (peers), 404 if absent (wait: up to S s
                                       for a fetch in flight here; stage=registry: only one at the registry stage)
    PUT  /v1/peers                     {"urls": [...], "self": url|null} -> replace the peer set (cluster membership)
    POST /v1/drop_caches               empty memory + disk chunk caches (benchmarks)
    POST /v1/shutdown                  unmount and exit
    GET  /metrics                      Prometheus text
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

import h11
import pydantic
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rollstack.errors import InvalidRequest, NotFound, RollstackError
from rollstack.fetch.fetcher import leaf_error
from rollstack.lazystore.service import LazyStoreService
from rollstack.lazystore.wire import (BeginEnvBody, BeginEnvsBody, FetchAllBody, LayersBody, PeersBody, PrefetchBody,
                                     ShareTraceBody)

log = logging.getLogger("rollstack.lazystore.control")

MAX_BODY = 16 << 20

Response = tuple[int, str, bytes]
B = TypeVar("B", bound=pydantic.BaseModel)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    body: bytes
    match: re.Match[str]

    def model(self, cls: type[B]) -> B:
        """The body as a `cls` (lazystore/wire.py), or InvalidRequest."""
        try:
            return cls.model_validate_json(self.body or b"{}")
        except pydantic.ValidationError as exc:
            errs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
            raise InvalidRequest(f"{self.method} {self.path}: {errs}") from None


Handler = Callable[["ControlApi", Request], Awaitable[Response]]


class ControlApi:
    def __init__(self, service: LazyStoreService, shutdown: Callable[[], None]) -> None:
        self.svc = service
        self.shutdown = shutdown

    async def handle(self, method: str, target: str, body: bytes) -> Response:
        try:
            return await self._route(method, target, body)
        except Exception as exc:  # noqa: BLE001 - answer, never drop the connection
            err = leaf_error(exc)
            if isinstance(err, RollstackError):
                return _json(err.status, {"error": err.to_dict()})
            log.exception("control %s %s failed", method, target)
            return _json(500, {"error": {"code": "internal_error", "message": repr(err)}})

    async def _route(self, method: str, target: str, body: bytes) -> Response:
        path, _, query = target.partition("?")
        for verb, pattern, handler in ROUTES:
            m = pattern.fullmatch(path)
            if m is not None and verb == method:
                return await handler(self, Request(method, path, query, body, m))
        raise NotFound(f"no route {method} {path}")

    # -- handlers (one per route, see ROUTES) ----------------------------------------------
    async def healthz(self, req: Request) -> Response:
        svc = self.svc
        return _json(200, {"ok": True, "mountpoint": str(svc.config.mountpoint), "pid": os.getpid(),
                           "layers": len(svc.layers)})

    async def metrics(self, req: Request) -> Response:
        self.svc.update_metric_gauges()
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.svc.metrics.registry)

    async def chunk(self, req: Request) -> Response:
        data = await self.svc.reads.chunk_bytes(req.match.group(1), _wait(req.query),
                                                "stage=registry" not in req.query.split("&"))
        if data is None:
            return _json(404, {"error": {"code": "not_found", "message": "chunk not cached here"}})
        return 200, "application/octet-stream", data

    async def stats(self, req: Request) -> Response:
        return _json(200, self.svc.stats())

    async def add_layers(self, req: Request) -> Response:
        return _json(200, await self.svc.add_layers(req.model(LayersBody).layers))

    async def fetch_all(self, req: Request) -> Response:
        doc = req.model(FetchAllBody)
        return _json(200, await self.svc.fetch_all(doc.layers, background=doc.background))

    async def set_peers(self, req: Request) -> Response:
        doc = req.model(PeersBody)
        return _json(200, {"urls": self.svc.set_peers(doc.urls, doc.self_url)})

    async def drop_caches(self, req: Request) -> Response:
        await self.svc.drop_caches()
        return _json(200, {"ok": True})

    async def stop(self, req: Request) -> Response:
        self.shutdown()
        return _json(200, {"ok": True})

    async def prefetch(self, req: Request) -> Response:
        doc = req.model(PrefetchBody)
        return _json(200, {"chunks": await self.svc.prefetch_trace(doc.trace_key, doc.env_id)})

    async def begin_env(self, req: Request) -> Response:
        doc = req.model(BeginEnvBody)
        return _json(200, await self.svc.begin_env(req.match.group(1), doc.layers, doc.trace_key, doc.background,
                                                   doc.fallback_key))

    async def begin_envs(self, req: Request) -> Response:
        doc = req.model(BeginEnvsBody)
        return _json(200, await self.svc.begin_envs(doc.ids, doc.layers, doc.trace_key, doc.background,
                                                    doc.fallback_key))

    async def env_stats(self, req: Request) -> Response:
        return _json(200, self.svc.env_stats(req.match.group(1)))

    async def end_env(self, req: Request) -> Response:
        return _json(200, await self.svc.end_env(req.match.group(1)))

    async def share_trace(self, req: Request) -> Response:
        doc = req.model(ShareTraceBody)
        return _json(200, {"chunks": await self.svc.share_trace(req.match.group(1), doc.keys)})


_ENV = r"/v1/envs/([^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], Handler]] = [(verb, re.compile(path), handler) for verb, path, handler in (
    ("GET", r"/healthz", ControlApi.healthz),
    ("GET", r"/metrics", ControlApi.metrics),
    ("GET", r"/v1/chunks/(sha256:[0-9a-f]{64})", ControlApi.chunk),
    ("GET", r"/v1/stats", ControlApi.stats),
    ("POST", r"/v1/layers", ControlApi.add_layers),
    ("POST", r"/v1/fetch_all", ControlApi.fetch_all),
    ("PUT", r"/v1/peers", ControlApi.set_peers),
    ("POST", r"/v1/drop_caches", ControlApi.drop_caches),
    ("POST", r"/v1/shutdown", ControlApi.stop),
    ("POST", r"/v1/prefetch", ControlApi.prefetch),
    ("POST", r"/v1/envs", ControlApi.begin_envs),
    ("POST", _ENV, ControlApi.begin_env),
    ("GET", _ENV, ControlApi.env_stats),
    ("DELETE", _ENV, ControlApi.end_env),
    ("POST", _ENV + "/trace", ControlApi.share_trace),
)]
"""(method, path pattern, handler): the whole API; the module docstring describes each route."""


def _wait(query: str) -> float:
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "wait":
            try:
                return max(0.0, float(value))
            except ValueError:
                raise InvalidRequest(f"wait={value!r} is not a number of seconds") from None
    return 0.0


def _json(status: int, doc: Any) -> Response:
    return status, "application/json", json.dumps(doc, default=str).encode()


# -- the HTTP server -------------------------------------------------------------------------
Serve = Callable[[str, str, bytes], Awaitable[Response]]


async def _serve_connection(stream: trio.abc.Stream, handler: Serve) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 << 10)
    try:
        while True:
            req = None
            body = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    conn.receive_data(data)
                    if not data and conn.their_state is not h11.DONE:
                        return
                    continue
                if isinstance(event, h11.Request):
                    req = event
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_BODY:
                        return
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert req is not None
            status, ctype, payload = await handler(req.method.decode(), req.target.decode(), bytes(body))
            headers = [("content-type", ctype), ("content-length", str(len(payload)))]
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
            await stream.send_all(conn.send(h11.Data(data=payload)))
            await stream.send_all(conn.send(h11.EndOfMessage()))
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (h11.RemoteProtocolError, h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError,
            ConnectionError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def unix_listener(path: Path) -> trio.SocketListener:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(128)
    return trio.SocketListener(sock)


async def tcp_listener(addr: str) -> trio.SocketListener:
    host, _, port = addr.rpartition(":")
    listeners = await trio.open_tcp_listeners(int(port), host=host or "127.0.0.1")
    return listeners[0]


async def serve(listeners: list[trio.SocketListener], handler: Serve,
                task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async def on_conn(stream: trio.abc.Stream) -> None:
        await _serve_connection(stream, handler)

    await trio.serve_listeners(on_conn, listeners, task_status=task_status)
