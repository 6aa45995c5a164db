"""Regressions of the node API fuzz (tests/integration/node/test_node_api_fuzz.py), each without
the fuzzer: what it sent, and what the API must answer."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fake_node_service import FakeService
from rollstack.node.api import create_app

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PLAN = {"name": "t", "groups": ["os/base:1"]}


@pytest.fixture
def http():
    with TestClient(create_app(FakeService(max_environments=2), TOKEN)) as client:
        yield client


def _env(http: TestClient) -> str:
    r = http.post("/v1/environments", json={"plan": PLAN}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.mark.parametrize("route,body", [
    ("/v1/leases", {"ids": [], "lease": True}),
    ("/v1/environments", {"plan": PLAN, "lease": True}),
    ("/v1/environments", {"plan": PLAN, "count": True}),
    ("ENV/lease", {"lease": False}),
    ("ENV/exec", {"argv": ["true"], "timeout": True}),
    ("ENV/exec", {"argv": ["true"], "timeout": "5"}),
])
def test_a_json_bool_or_string_is_not_a_number(http: TestClient, route: str, body: dict) -> None:
    # Found: {"ids": [...], "lease": true} renewed with a 1 s lease (pydantic's lax mode took the
    # bool for 1.0): a client's garbage silently reaped its environments a second later.
    route = route.replace("ENV", f"/v1/environments/{_env(http)}")
    r = http.post(route, json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request"


def test_numbers_still_are_numbers(http: TestClient) -> None:
    env_id = _env(http)
    assert http.post("/v1/leases", json={"ids": [env_id], "lease": 30}, headers=AUTH).status_code == 200
    assert http.post(f"/v1/environments/{env_id}/exec", json={"argv": ["true"], "timeout": 5},
                     headers=AUTH).status_code == 200


def test_every_operation_documents_its_errors_as_json(http: TestClient) -> None:
    # Found: the routes answering text (diff, metrics) documented their JSON error bodies as
    # text/plain (FastAPI applies a route's response_class to its extra responses).
    doc = http.get("/openapi.json").json()
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            content = op["responses"]["default"]["content"]
            assert list(content) == ["application/json"], (method, path, content)
            assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}


def test_raw_bodies_are_documented_with_their_media_types(http: TestClient) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    files = paths["/v1/environments/{env_id}/files"]
    assert "application/octet-stream" in files["get"]["responses"]["200"]["content"]
    assert "application/octet-stream" in files["put"]["requestBody"]["content"]
    assert "text/plain" in paths["/v1/environments/{env_id}/diff"]["get"]["responses"]["200"]["content"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    env_id = _env(http)
    r = http.get(f"/v1/environments/{env_id}/diff", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    r = http.get("/v1/environments/nope/diff", headers=AUTH)
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
