"""Regressions of the E2B API fuzz (tests/integration/e2b/test_e2b_api_fuzz.py), without the
fuzzer or a node: the control app's answers to routes it does not have, and its OpenAPI."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from rollstack.e2b.control import UNSUPPORTED, create_control_app
from rollstack.e2b.sandboxes import SandboxTable

KEY = {"X-API-KEY": "k"}


@pytest.fixture
def http():
    with TestClient(create_control_app(SandboxTable(None), None, "k")) as client:
        yield client


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_a_route_e2b_does_not_have_is_404_not_501(http: TestClient, method: str) -> None:
    # Found: DELETE /sandboxes/0/0 answered 501 "'0' is not supported": a server error for a
    # client's typo. 501 is for E2B's own routes rollstack leaves out.
    r = http.request(method, "/sandboxes/abc/0", headers=KEY)
    assert r.status_code == 404 and r.json()["code"] == 404


@pytest.mark.parametrize("feature", sorted(UNSUPPORTED))
def test_e2b_routes_rollstack_leaves_out_are_501(http: TestClient, feature: str) -> None:
    r = http.post(f"/sandboxes/abc/{feature}", headers=KEY)
    assert r.status_code == 501 and "not supported" in r.json()["message"]


def test_every_operation_documents_e2b_error_bodies(http: TestClient) -> None:
    app = http.app
    doc = app.openapi()
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            content = op["responses"]["default"]["content"]
            assert content == {"application/json": {"schema": {"$ref": "#/components/schemas/E2BError"}}}, (method, path)
    upload = doc["paths"]["/files"]["post"]["requestBody"]["content"]
    assert {"application/octet-stream", "multipart/form-data"} <= set(upload)
