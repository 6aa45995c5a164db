"""`expose`: a port inside an environment, reached by the client through the node's API.

    ANY /v1/environments/{id}/ports/{port}/{path}   ->   http://<env address>:{port}/{path}

The route sits behind the API's bearer token like every other; the node token itself (and the
hop-by-hop headers) never travel into the environment. Only ports the plan lists under
`expose` are served (`not_found` otherwise); a listed port nobody listens on is
`port_unavailable` (502) naming the port. Bodies are buffered, both ways, up to the API's body
limit: this serves HTTP apps (a dev server, a notebook, a health endpoint), not raw TCP.
"""

from __future__ import annotations

from typing import Any

import httpx

from rollstack.errors import PortUnavailable

HOP_BY_HOP = frozenset({
    "authorization", "host", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "transfer-encoding", "upgrade", "content-length",
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


async def forward(base: str, env_id: str, port: int, method: str, path: str, query: str,
                  headers: dict[str, str], body: bytes, timeout: float = 60.0) -> httpx.Response:
    url = f"{base}/{path}" + (f"?{query}" if query else "")
    fwd = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            return await client.request(method, url, headers=fwd, content=body)
    except httpx.ConnectError as exc:
        raise PortUnavailable(f"nothing listens on port {port} in environment {env_id} ({exc})",
                              port=port) from None
    except httpx.TimeoutException as exc:
        raise PortUnavailable(f"port {port} in environment {env_id} did not answer in {timeout}s",
                              port=port) from exc


def response_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding"}
