"""The pool gateway: the node HTTP API for a whole pool (`rollstack cluster gateway`).

For the CLI (`--node http://gateway`), non-Python clients and the adapters, which speak to one
node. `POST /v1/environments` places (as `Pool.create` does) and creates on the chosen node; every
other call is forwarded by environment id to its node (bodies and exec streams passed through);
`GET /v1/environments` and `/healthz` aggregate the nodes. A call whose node died or restarted
answers `node_lost`. The E2B-compatible API for the pool is served beside it (gateway_e2b).

The only state is env id -> node, and it is rebuilt from the nodes' own lists (`GET /v1/node`
env_ids) whenever an id is unknown: restart the gateway and no environment is lost. Python users
should prefer `Pool`, whose data path skips this hop.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rollstack.cluster.gateway_e2b import E2BGateway
from rollstack.cluster.pool import Pool
from rollstack.core.httppool import SERVER_KEEPALIVE_S, limits
from rollstack.errors import EnvironmentNotFound, NodeLost, RollstackError, Unauthorized

log = logging.getLogger(__name__)


def create_gateway(pool: Pool, token: str | None) -> FastAPI:
    owner: dict[str, str] = {}
    born: dict[str, str | None] = {}  # env id -> the node's agent instance it was created under
    clients: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        for c in clients.values():
            await c.aclose()

    app = FastAPI(title="rollstack pool gateway", version="1", lifespan=lifespan)

    @app.exception_handler(RollstackError)
    async def _err(_req: Request, exc: RollstackError) -> JSONResponse:
        return JSONResponse({"error": exc.to_dict()}, status_code=exc.status)

    def authorize(request: Request) -> None:
        import hmac

        if token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise Unauthorized("missing or wrong bearer token")

    def client(node_id: str) -> tuple[httpx.AsyncClient, Any]:
        m = pool.directory.member(node_id)
        if m is None:
            raise NodeLost(f"node {node_id} left the pool", node=node_id)
        c = clients.get(node_id)
        if c is None or str(c.base_url).rstrip("/") != m.url:
            c = clients[node_id] = httpx.AsyncClient(
                base_url=m.url, headers={"Authorization": f"Bearer {m.token}"} if m.token else {},
                timeout=httpx.Timeout(None, connect=5.0), limits=limits())
        return c, m

    async def locate(env_id: str) -> str:
        node_id = owner.get(env_id)
        if node_id is not None:
            return node_id
        await anyio.to_thread.run_sync(pool.directory.poll)  # rebuild from the nodes' own lists
        for m in list(pool.directory.members.values()):
            for eid in (m.info or {}).get("env_ids", []):
                owner[eid] = m.node_id
                born[eid] = (m.info or {}).get("instance")
        if env_id not in owner:
            raise EnvironmentNotFound(f"no environment {env_id!r} in the pool")
        return owner[env_id]

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        h = await anyio.to_thread.run_sync(pool.health)
        return h.model_dump()

    @app.post("/v1/environments", status_code=201)
    async def create(request: Request) -> Response:
        authorize(request)
        doc = await request.json()
        plan = doc.get("plan") if isinstance(doc, dict) else None
        if not isinstance(plan, dict):
            from rollstack.errors import InvalidRequest

            raise InvalidRequest("the body is {\"plan\": {...}}")
        count = doc.get("count")
        key = request.headers.get("idempotency-key")  # the node's idempotent create, through the pool
        if count is not None:  # a GRPO group: placed together by the pool, all or none
            from pydantic import ValidationError

            from rollstack.errors import InvalidRequest
            from rollstack.contract.models import CreateGroupResponse, CreateRequest

            try:
                CreateRequest.model_validate({"plan": plan, "count": count})  # the node API's bounds
            except ValidationError as exc:
                raise InvalidRequest(f"count: {exc.errors()[0].get('msg', 'invalid')}") from None
            envs = await anyio.to_thread.run_sync(lambda: pool.create(plan, count=count, idempotency_key=key))
        else:
            envs = [await anyio.to_thread.run_sync(lambda: pool.create(plan, idempotency_key=key))]
        for env in envs:
            owner[env.id] = env.node_id
            born[env.id] = pool.directory.instance(env.node_id)
        if count is None:
            return Response(envs[0].created.model_dump_json(), status_code=201, media_type="application/json")
        group = CreateGroupResponse(environments=[e.created for e in envs])
        return Response(group.model_dump_json(), status_code=201, media_type="application/json")

    @app.get("/v1/environments")
    async def list_envs(request: Request) -> dict[str, Any]:
        authorize(request)
        envs = await anyio.to_thread.run_sync(pool.list)
        return {"environments": [e.model_dump() for e in envs]}

    @app.api_route("/v1/environments/{env_id}{tail:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def forward(env_id: str, tail: str, request: Request) -> Response:
        authorize(request)
        node_id = await locate(env_id)
        c, m = client(node_id)
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type",)}
        req = c.build_request(request.method, f"/v1/environments/{env_id}{tail}", params=request.query_params,
                              content=body, headers=headers)
        try:
            resp = await c.send(req, stream=True)
        except httpx.TransportError as exc:
            pool.directory.mark_dead(node_id)
            owner.pop(env_id, None)
            raise NodeLost(f"node {node_id} ({m.url}) was lost: {exc}", node=node_id) from None
        if resp.status_code == 404 and await anyio.to_thread.run_sync(pool.directory.lost, node_id, born.get(env_id)):
            await resp.aclose()
            raise NodeLost(f"node {node_id} ({m.url}) was lost", node=node_id)
        if request.method == "DELETE" and resp.status_code < 300:
            owner.pop(env_id, None)
        media = resp.headers.get("content-type")
        if tail.endswith("/stream") and resp.status_code < 400:
            return StreamingResponse(_relay(resp), status_code=resp.status_code, media_type=media)
        content = await resp.aread()
        await resp.aclose()
        return Response(content, status_code=resp.status_code, media_type=media)

    app.add_middleware(E2BGateway, pool=pool, token=token)  # the E2B API for the pool (gateway_e2b)
    return app


async def _relay(resp: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    finally:
        await resp.aclose()


def serve(address: str | None, listen: str, token: str | None = None) -> None:
    """Run the gateway until SIGINT/SIGTERM. `token` defaults to the cluster's token."""
    import uvicorn

    pool = Pool(address, lease=None)  # the gateway's clients hold their environments, not it
    try:
        if token is None:
            token = next((m.token for m in pool.directory.members.values() if m.token), None)
        host, _, port = listen.rpartition(":")
        uvicorn.run(create_gateway(pool, token), host=host or "127.0.0.1", port=int(port), log_level="warning",
                    access_log=False, timeout_keep_alive=SERVER_KEEPALIVE_S)
    finally:
        pool.close()
