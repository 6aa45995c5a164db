"""The HTTP API over a fake service: auth, error bodies, validation, streaming, OpenAPI."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from fake_node_service import FakeService
from rollstack.node.api import create_app

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PLAN = {"name": "t", "groups": ["os/base:1"]}


@pytest.fixture
def service() -> FakeService:
    return FakeService(max_environments=2)


@pytest.fixture
def http(service: FakeService):
    with TestClient(create_app(service, TOKEN)) as client:
        yield client


def create(http: TestClient) -> str:
    r = http.post("/v1/environments", json={"plan": PLAN}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_healthz_needs_no_token(http: TestClient) -> None:
    r = http.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
@pytest.mark.parametrize("method,path", [("GET", "/v1/environments"), ("POST", "/v1/environments"), ("GET", "/metrics"), ("DELETE", "/v1/environments/x")])
def test_everything_else_needs_the_token(http: TestClient, headers: dict, method: str, path: str) -> None:
    r = http.request(method, path, headers=headers, json={"plan": PLAN})
    assert r.status_code == 401
    assert r.json() == {"error": {"code": "unauthorized", "message": "missing or wrong bearer token",
                                    "retryable": False}}
    assert r.headers["www-authenticate"] == "Bearer"


def test_create_document_has_the_interface_shape(http: TestClient) -> None:
    r = http.post("/v1/environments", json={"plan": PLAN}, headers=AUTH)
    doc = r.json()
    assert set(doc["timings"]) >= {"resolve", "toc", "mount", "mutation", "start", "total"}
    assert set(doc["fetch"]) >= {"stack_bytes", "fetched_bytes", "from_cache_bytes", "from_peer_bytes"}


def test_errors_carry_code_and_status(http: TestClient) -> None:
    r = http.post("/v1/environments", json={"plan": {"name": "no groups"}}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["code"] == "plan_invalid"
    r = http.get("/v1/environments/nope", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "environment_not_found"
    create(http), create(http)
    r = http.post("/v1/environments", json={"plan": PLAN}, headers=AUTH)
    assert r.status_code == 503 and r.json()["error"]["code"] == "insufficient_capacity"


@pytest.mark.parametrize(
    "body",
    [{}, {"argv": ["a"], "command": "b"}, {"argv": []}, {"argv": "ls"}, {"command": "x", "timeout": -1}, {"command": "x", "bogus": 1}],
)
def test_validation_errors_use_our_body(http: TestClient, body: dict) -> None:
    env_id = create(http)
    r = http.post(f"/v1/environments/{env_id}/exec", json=body, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_request"
    assert set(r.json()) == {"error"}


def test_malformed_json_and_missing_query_are_invalid_request(http: TestClient) -> None:
    r = http.post("/v1/environments", content=b"{not json", headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    env_id = create(http)
    r = http.get(f"/v1/environments/{env_id}/files", headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


def test_unknown_route_uses_our_body(http: TestClient) -> None:
    r = http.get("/v2/nothing", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_exec_shell_command_goes_through_sh(http: TestClient, service: FakeService) -> None:
    env_id = create(http)
    r = http.post(f"/v1/environments/{env_id}/exec", json={"command": "echo hi", "cwd": "/w", "stdin": "in"}, headers=AUTH)
    assert r.status_code == 200
    assert r.json()["stdout"] == "/bin/sh -c echo hi\nin"
    assert service.last_exec is not None and service.last_exec.cwd == "/w"


def test_exec_stream_is_ndjson_ending_with_result(http: TestClient) -> None:
    env_id = create(http)
    with http.stream("POST", f"/v1/environments/{env_id}/exec/stream", json={"argv": ["a", "b"]}, headers=AUTH) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [c["type"] for c in lines] == ["stdout", "stdout", "stderr", "result"]
    assert lines[-1]["result"]["exit_code"] == 7


def test_exec_stream_error_midway_is_the_last_line(http: TestClient) -> None:
    env_id = create(http)
    with http.stream("POST", f"/v1/environments/{env_id}/exec/stream", json={"argv": ["explode"]}, headers=AUTH) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1] == {"type": "error", "error": {"code": "plan_invalid", "message": "boom mid-stream",
                                                             "retryable": False}}


def test_exec_stream_unknown_env_is_404(http: TestClient) -> None:
    r = http.post("/v1/environments/nope/exec/stream", json={"argv": ["a"]}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "environment_not_found"


def test_files_roundtrip_raw_bytes_and_unsafe_path(http: TestClient) -> None:
    env_id = create(http)
    data = bytes(range(256))
    r = http.put(f"/v1/environments/{env_id}/files", params={"path": "/w/x.bin"}, content=data, headers=AUTH)
    assert r.status_code == 204
    r = http.get(f"/v1/environments/{env_id}/files", params={"path": "/w/x.bin"}, headers=AUTH)
    assert r.content == data
    r = http.get(f"/v1/environments/{env_id}/files", params={"path": "/../etc/passwd"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsafe_path"


def test_destroy_is_idempotent(http: TestClient) -> None:
    env_id = create(http)
    assert http.delete(f"/v1/environments/{env_id}", headers=AUTH).status_code == 204
    assert http.delete(f"/v1/environments/{env_id}", headers=AUTH).status_code == 204
    assert http.get("/v1/environments", headers=AUTH).json() == {"environments": []}


def test_metrics_are_prometheus_text(http: TestClient) -> None:
    create(http)
    r = http.get("/metrics", headers=AUTH)
    assert r.status_code == 200
    assert "rollstack_environments 1.0" in r.text
    assert 'rollstack_api_seconds_count{op="create"}' in r.text


def test_openapi_document_lists_the_routes(http: TestClient) -> None:
    doc = http.get("/openapi.json").json()
    paths = doc["paths"]
    for route in ("/v1/environments", "/v1/environments/{env_id}", "/v1/environments/{env_id}/exec",
                  "/v1/environments/{env_id}/exec/stream", "/v1/environments/{env_id}/files",
                  "/v1/environments/{env_id}/diff", "/v1/environments/{env_id}/evaluate",
                  "/v1/environments/{env_id}/stats", "/healthz", "/metrics"):
        assert route in paths
    assert "ExecRequest" in doc["components"]["schemas"]


def test_oversized_upload_is_refused_before_reading(service: FakeService) -> None:
    with TestClient(create_app(service, TOKEN, max_body=10)) as http:
        env_id = create(http)
        r = http.put(f"/v1/environments/{env_id}/files", params={"path": "/x"}, content=b"x" * 11, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        assert http.put(f"/v1/environments/{env_id}/files", params={"path": "/x"}, content=b"x" * 10, headers=AUTH).status_code == 204


class LoopExecService(FakeService):
    """A service with the node's `exec_async`: awaited on the API's loop, blocking parts offloaded."""

    def __init__(self) -> None:
        super().__init__(max_environments=2)
        self.threads: dict[str, int] = {}

    async def exec_async(self, env_id: str, request, offload):
        import threading

        self.threads["exec_async"] = threading.get_ident()
        result = await offload(lambda: self.exec(env_id, request))
        self.threads["offloaded"] = threading.get_ident()
        return result

    def exec(self, env_id: str, request):
        import threading

        self.threads["blocking"] = threading.get_ident()
        return super().exec(env_id, request)


def test_exec_is_awaited_on_the_loop_and_offloads_blocking_parts() -> None:
    service = LoopExecService()
    with TestClient(create_app(service, TOKEN)) as http:
        env_id = create(http)
        r = http.post(f"/v1/environments/{env_id}/exec", json={"argv": ["echo", "x"]}, headers=AUTH)
        assert r.status_code == 200 and r.json()["stdout"] == "echo x\n"
        assert service.threads["exec_async"] == service.threads["offloaded"]  # the loop's thread
        assert service.threads["blocking"] != service.threads["exec_async"]  # a worker thread
        r = http.post("/v1/environments/nope/exec", json={"argv": ["true"]}, headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "environment_not_found"
        assert 'rollstack_api_seconds_count{op="exec"} 2.0' in http.get("/metrics", headers=AUTH).text
