"""The standard bearer-token flow against the real docker-registry (token auth mode).

A tiny token server (loopback, RS256 JWTs signed with `openssl`, x5c header, the cert is the
registry's rootcertbundle) grants exactly the scopes asked for to one user. A HEAD earns a pull
token; the following upload is refused with a wider scope and the client refreshes on that 401.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from rollstack.errors import RegistryAuthError
from rollstack.store import RegistryServer, RegistryStore

pytestmark = pytest.mark.integration

SERVICE, ISSUER, USER, PASSWORD = "rollstack-test", "rollstack-test-issuer", "alice", "pw"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, workdir: Path) -> None:
        self.key, self.cert = workdir / "key.pem", workdir / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.cert), "-days", "2", "-subj", "/CN=rollstack-test-token"],
                       check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.requests: list[dict[str, list[str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                query = parse_qs(urlsplit(self.path).query)
                server.requests.append(query)
                want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": server.issue(query.get("scope", [])), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def issue(self, scopes: list[str]) -> str:
        access = []
        for scope in " ".join(scopes).split():
            kind, name, actions = scope.split(":", 2) if scope.count(":") >= 2 else (scope, "", "")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": os.urandom(8).hex(), "access": access}
        signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing_input.encode(),
                             check=True, capture_output=True).stdout
        return f"{signing_input}.{b64url(sig)}"

    def __enter__(self) -> "TokenServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def _scope_actions(query: dict, repo: str) -> set[str]:
    for scope in query.get("scope", []):
        kind, _, rest = scope.partition(":")
        name, _, actions = rest.rpartition(":")
        if kind == "repository" and name == repo:
            return set(actions.split(","))
    return set()


@pytest.fixture
def token_registry(tmp_path):
    with TokenServer(tmp_path) as tokens:
        auth = {"token": {"realm": tokens.realm, "service": SERVICE, "issuer": ISSUER,
                          "rootcertbundle": str(tokens.cert)}}
        with RegistryServer(tmp_path / "reg", auth=auth) as server:
            yield server, tokens


def test_bearer_flow_with_refresh_on_wider_scope(token_registry, unique_repo):
    server, tokens = token_registry
    data = os.urandom(10_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with RegistryStore(server.url, username=USER, password=PASSWORD) as store:
        assert store.has_blob(unique_repo, digest) is False  # 401 -> pull token -> 404
        assert tokens.requests[0]["service"] == [SERVICE]
        assert tokens.requests[0]["scope"] == [f"repository:{unique_repo}:pull"]
        assert store.put_blob(unique_repo, digest, data) is True  # pull token refused -> push token
        # the registry names the actions in its challenge in no fixed order (a Go map)
        assert any(_scope_actions(q, unique_repo) == {"pull", "push"} for q in tokens.requests[1:])
        issued = len(tokens.requests)
        assert store.read_blob(unique_repo, digest, 10, 20) == data[10:30]
        assert store.blob_size(unique_repo, digest) == len(data)
        assert len(tokens.requests) == issued  # cached token reused
        assert unique_repo in store.list_repositories()  # registry:catalog:* scope


def test_bad_credentials_are_auth_error(token_registry, unique_repo):
    server, _ = token_registry
    for creds in ({}, {"username": USER, "password": "wrong"}):
        with RegistryStore(server.url, **creds) as store, pytest.raises(RegistryAuthError):
            store.has_blob(unique_repo, "sha256:" + "0" * 64)
