"""The contract is the one source: the server serves exactly its routes, and the sync and async
clients (services and handles) offer the same calls."""

from __future__ import annotations

import inspect

from fastapi.routing import APIRoute

from rollstack.client._clients import AsyncClient, Client
from rollstack.client._handles import AsyncEnvironment, Environment
from rollstack.client._transports import AsyncHttpService, HttpService, ThreadedService
from rollstack.client.local import AsyncNode, Node
from rollstack.contract import routes as R
from rollstack.contract.service import AsyncEnvironmentService, EnvironmentService
from rollstack.node.api import create_app
from rollstack.node.service import NodeService


def _public(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_the_server_serves_exactly_the_contracts_routes() -> None:
    app = create_app(object(), token=None, e2b=False)  # routes only: nothing is called
    served = {(m, r.path) for r in app.routes if isinstance(r, APIRoute) and r.include_in_schema
              for m in r.methods}
    assert served == {(r.method, r.template) for r in R.ALL}
    assert R.PORT in {r.path for r in app.routes if isinstance(r, APIRoute)}


def test_route_paths_fill_in_one_segment_per_parameter() -> None:
    assert R.EXEC.path(env_id="e1") == "/v1/environments/e1/exec"
    assert R.INFO.path(env_id="../node") == "/v1/environments/..%2Fnode"


def test_the_async_protocol_twins_the_sync_one() -> None:
    sync = _public(EnvironmentService) - {"exec_async", "port_target"}  # node-side only
    assert sync == _public(AsyncEnvironmentService)
    for name in sync - {"exec_stream"}:
        assert inspect.iscoroutinefunction(getattr(AsyncEnvironmentService, name)), name


def test_the_http_services_implement_the_contract_and_match_each_other() -> None:
    wanted = _public(EnvironmentService) - {"exec_async", "port_target"}
    assert wanted <= _public(HttpService)
    assert wanted <= _public(AsyncHttpService)
    assert _public(HttpService) - {"close", "http"} == _public(AsyncHttpService) - {"aclose"}
    for name in wanted - {"exec_stream"}:
        assert inspect.iscoroutinefunction(getattr(AsyncHttpService, name)), name


def test_the_node_implements_the_whole_contract() -> None:
    assert _public(EnvironmentService) <= _public(NodeService)
    assert {"exec_attached", "set_timeout", "with_root", "max_file_bytes"} <= _public(NodeService)


def test_sync_and_async_handles_offer_the_same_calls() -> None:
    assert _public(Environment) == _public(AsyncEnvironment)
    assert _public(Client) - {"close"} == _public(AsyncClient) - {"aclose"}
    assert {"create", "get", "list", "destroy", "health", "metrics"} <= _public(AsyncClient)


def test_the_in_process_twins_match_their_clients() -> None:
    assert _public(Node) - {"close", "service", "config"} == _public(Client) - {"close", "url"}
    assert _public(AsyncNode) - {"aclose", "start", "service", "config"} == _public(AsyncClient) - {"aclose", "url"}
    wanted = _public(AsyncEnvironmentService)
    assert wanted <= _public(ThreadedService)
    for name in wanted - {"exec_stream"}:
        assert inspect.iscoroutinefunction(getattr(ThreadedService, name)), name
