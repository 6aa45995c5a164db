"""`expose`: a port inside an environment, reached by the client through the node's API.

    ANY /v1/environments/{id}/ports/{port}/{path}   ->   http://<env address>:{port}/{path}

The route sits behind the API's bearer token like every other; the node token itself (and the
hop-by-hop headers) never travel into the environment. Only ports the plan lists under
`expose` are served (`not_found` otherwise); a listed port nobody listens on is
`port_unavailable` (502) naming the port. Bodies stream both ways (`proxy`): a request body is
sent on as it arrives, the response as the environment produces it (server-sent events, long
downloads, chunked output), raw (a content-encoding stays as the app chose it). HTTP only, not
raw TCP or WebSocket upgrades.
"""

from __future__ import annotations

from typing import Any

import httpx

from rollstack.errors import PortUnavailable

HOP_BY_HOP = frozenset({
    "authorization", "host", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade",  # content-length passes: bodies stream as they are
})


def port_target(rec: Any, port: int) -> str:
    """`http://ADDRESS:PORT` of an exposed port of a running environment's record."""
    from rollstack.errors import NotFound

    exposed = list(getattr(rec.plan, "expose", []) or [])
    if port not in exposed:
        raise NotFound(f"port {port} of environment {rec.id} is not exposed (plan expose: {exposed})")
    net = rec.runtime.net if rec.runtime is not None else None
    if net is None:
        raise PortUnavailable(f"environment {rec.id} has no network address")
    return f"http://{net.address}:{port}"


async def proxy(base: str, env_id: str, port: int, request: Any, timeout: float = 60.0) -> Any:
    """`request` (a Starlette request) to the environment's port, streamed both ways."""
    from starlette.background import BackgroundTask
    from starlette.responses import StreamingResponse

    url = f"{base}/{request.path_params['path']}" + (f"?{request.url.query}" if request.url.query else "")
    fwd = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    client = httpx.AsyncClient(timeout=timeout, trust_env=False)
    try:
        req = client.build_request(request.method, url, headers=fwd,
                                   content=request.stream() if has_body else None)
        resp = await client.send(req, stream=True)
    except BaseException as exc:
        await client.aclose()
        if isinstance(exc, httpx.ConnectError):
            raise PortUnavailable(f"nothing listens on port {port} in environment {env_id} ({exc})",
                                  port=port) from None
        if isinstance(exc, httpx.TimeoutException):
            raise PortUnavailable(f"port {port} in environment {env_id} did not answer in {timeout}s",
                                  port=port) from exc
        raise

    async def close() -> None:
        await resp.aclose()
        await client.aclose()

    headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
    return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=headers,
                             background=BackgroundTask(close))
