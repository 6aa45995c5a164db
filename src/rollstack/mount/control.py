"""The daemon's control API: small HTTP/1.1 (h11) on trio, over a unix socket and optionally TCP.

JSON in, JSON out; errors as `{"error": {"code", "message"}}` with the error's HTTP status.

    GET  /healthz                      {"ok": true, "mountpoint": ...}
    POST /v1/layers                    {"layers": [{repo, digest}]} -> add_layers timings
    POST /v1/fetch_all                 {"layers": [...], "background": bool} -> {"seconds", "fetched_bytes", "stack_bytes"}
    POST /v1/envs/<id>                 {"layers": [...], "trace_key": k|null, "fallback_key": k|null, "background": bool}
    GET  /v1/envs/<id>                 env stats
    DELETE /v1/envs/<id>               end env -> final stats
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
from pathlib import Path
from typing import Any, Awaitable, Callable

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rollstack.errors import InvalidRequest, NotFound, RollstackError
from rollstack.fetch.fetcher import leaf_error
from rollstack.mount.service import LazyStoreService

log = logging.getLogger("rollstack.mount.control")

MAX_BODY = 16 << 20
_ENV = re.compile(r"^/v1/envs/([^/]+)$")
_CHUNK = re.compile(r"^/v1/chunks/(sha256:[0-9a-f]{64})$")

Response = tuple[int, str, bytes]


class ControlApi:
    def __init__(self, service: LazyStoreService, shutdown: Callable[[], None]) -> None:
        self.svc = service
        self.shutdown = shutdown

    async def handle(self, method: str, path: str, body: bytes) -> Response:
        try:
            return await self._route(method, path, body)
        except Exception as exc:  # noqa: BLE001 - answer, never drop the connection
            err = leaf_error(exc)
            if isinstance(err, RollstackError):
                return _json(err.status, {"error": err.to_dict()})
            log.exception("control %s %s failed", method, path)
            return _json(500, {"error": {"code": "internal_error", "message": repr(err)}})

    async def _route(self, method: str, path: str, body: bytes) -> Response:
        path, _, query = path.partition("?")
        svc = self.svc
        if path == "/healthz":
            return _json(200, {"ok": True, "mountpoint": str(svc.config.mountpoint), "pid": os.getpid(),
                               "layers": len(svc.layers)})
        if path == "/metrics":
            svc.update_metric_gauges()
            return 200, CONTENT_TYPE_LATEST, generate_latest(svc.metrics.registry)
        m = _CHUNK.match(path)
        if m and method == "GET":
            data = await svc.chunk_bytes(m.group(1), _wait(query), "stage=registry" not in query.split("&"))
            if data is None:
                return _json(404, {"error": {"code": "not_found", "message": "chunk not cached here"}})
            return 200, "application/octet-stream", data
        if path == "/v1/stats" and method == "GET":
            return _json(200, svc.stats())
        doc = _body(body)
        if path == "/v1/layers" and method == "POST":
            return _json(200, await svc.add_layers(_layers(doc)))
        if path == "/v1/fetch_all" and method == "POST":
            return _json(200, await svc.fetch_all(_layers(doc), background=bool(doc.get("background", False))))
        if path == "/v1/peers" and method == "PUT":
            urls = doc.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise InvalidRequest("peers needs 'urls': a list of strings")
            return _json(200, {"urls": svc.set_peers(urls, _opt_str(doc, "self"))})
        if path == "/v1/drop_caches" and method == "POST":
            svc.drop_caches()
            return _json(200, {"ok": True})
        if path == "/v1/shutdown" and method == "POST":
            self.shutdown()
            return _json(200, {"ok": True})
        if path == "/v1/prefetch" and method == "POST":
            key = doc.get("trace_key")
            if not isinstance(key, str):
                raise InvalidRequest("prefetch needs a trace_key")
            trace = svc.traces.load(key)
            env = svc.envs.envs.get(str(doc.get("env_id"))) if doc.get("env_id") else None
            if trace:
                await svc._trace_prefetch(env or _scratch_env(), trace)  # noqa: SLF001
            return _json(200, {"chunks": len(trace)})
        m = _ENV.match(path)
        if m:
            env_id = m.group(1)
            if method == "POST":
                return _json(200, await svc.begin_env(env_id, _layers(doc), _opt_str(doc, "trace_key"),
                                                      bool(doc.get("background", True)),
                                                      _opt_str(doc, "fallback_key")))
            if method == "GET":
                return _json(200, svc.env_stats(env_id))
            if method == "DELETE":
                return _json(200, svc.end_env(env_id))
        raise NotFound(f"no route {method} {path}")


def _wait(query: str) -> float:
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "wait":
            try:
                return max(0.0, float(value))
            except ValueError:
                raise InvalidRequest(f"wait={value!r} is not a number of seconds") from None
    return 0.0


def _scratch_env() -> Any:
    from rollstack.mount.envs import Env

    return Env("prefetch", [])


def _body(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except ValueError:
        raise InvalidRequest("body is not JSON") from None
    if not isinstance(doc, dict):
        raise InvalidRequest("body must be a JSON object")
    return doc


def _opt_str(doc: dict[str, Any], name: str) -> str | None:
    value = doc.get(name)
    if value is not None and (not isinstance(value, str) or not value or len(value) > 1024):
        raise InvalidRequest(f"{name} must be a non-empty string of at most 1024 characters")
    return value


def _layers(doc: dict[str, Any]) -> list[Any]:
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise InvalidRequest("'layers' must be a list of {repo, digest}")
    return layers


def _json(status: int, doc: Any) -> Response:
    return status, "application/json", json.dumps(doc, default=str).encode()


# -- the HTTP server -------------------------------------------------------------------------
Handler = Callable[[str, str, bytes], Awaitable[Response]]


async def _serve_connection(stream: trio.abc.Stream, handler: Handler) -> None:
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


async def serve(listeners: list[trio.SocketListener], handler: Handler,
                task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async def on_conn(stream: trio.abc.Stream) -> None:
        await _serve_connection(stream, handler)

    await trio.serve_listeners(on_conn, listeners, task_status=task_status)
