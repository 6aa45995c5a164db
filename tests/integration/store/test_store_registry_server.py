"""RegistryStore against the real docker-registry: mounts, chunked uploads, parallel range reads,
auth (htpasswd), a registry that dies (RegistryUnavailable, not a hang), and `registry serve`."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from rollstack.errors import RegistryAuthError, RegistryUnavailable
from rollstack.store import RegistryServer, RegistryStore, RetryPolicy, open_store

pytestmark = pytest.mark.integration


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a non-reaping init counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def uploads(store: RegistryStore) -> int:
    req = store.stats.snapshot()["requests"]
    return req.get("PUT", 0) + req.get("PATCH", 0)


def test_cross_repository_mount_sends_no_bytes(registry_store, unique_repo):
    data = os.urandom(200_000)
    d = digest_of(data)
    assert registry_store.put_blob(unique_repo + "/src", d, data) is True
    before = uploads(registry_store)
    assert registry_store.put_blob(unique_repo + "/dst", d, data) is False
    assert uploads(registry_store) == before
    assert registry_store.stats.mounts == 1
    assert registry_store.read_blob(unique_repo + "/dst", d, 199_990, 100) == data[-10:]


def test_chunked_upload_of_a_file(registry, unique_repo, tmp_path):
    data = os.urandom(5 << 20)
    path = tmp_path / "big"
    path.write_bytes(data)
    with RegistryStore(registry.url, chunk_size=2 << 20) as store:
        assert store.put_blob(unique_repo, digest_of(data), path) is True
        assert store.stats.requests["PATCH"] == 3
        assert store.blob_size(unique_repo, digest_of(data)) == len(data)
        assert store.read_blob(unique_repo, digest_of(data), (4 << 20) + 7, 1 << 20) == data[(4 << 20) + 7:]


def test_parallel_range_reads(registry_store, unique_repo):
    data = os.urandom(4 << 20)
    d = digest_of(data)
    registry_store.put_blob(unique_repo, d, data)
    spans = [(i * 65_536 + i, 65_536) for i in range(64)]
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda s: registry_store.read_blob(unique_repo, d, *s), spans))
    assert got == [data[o:o + n] for o, n in spans]


def test_killed_registry_is_unavailable_not_a_hang(tmp_path, unique_repo):
    server = RegistryServer(tmp_path / "reg").start()
    store = RegistryStore(server.url, timeout=3.0, retry=RetryPolicy(retries=2, backoff=0.05, deadline=5.0))
    try:
        data = b"soon unreachable"
        store.put_blob(unique_repo, digest_of(data), data)
        assert store.read_blob(unique_repo, digest_of(data), 0, 4) == b"soon"
        server.kill()
        with pytest.raises(RegistryUnavailable):
            store.read_blob(unique_repo, digest_of(data), 0, 4)
        with pytest.raises(RegistryUnavailable):
            store.put_blob(unique_repo, digest_of(b"new"), b"new")
        with pytest.raises(RegistryUnavailable):
            store.list_repositories()
    finally:
        store.close()
        server.stop()


def test_restarted_registry_keeps_data(tmp_path, unique_repo):
    data = b"persistent"
    with RegistryServer(tmp_path / "reg") as server, RegistryStore(server.url) as store:
        store.put_blob(unique_repo, digest_of(data), data)
    with RegistryServer(tmp_path / "reg") as server, RegistryStore(server.url) as store:
        assert store.read_blob(unique_repo, digest_of(data), 0, 100) == data


def test_htpasswd_basic_auth(tmp_path, unique_repo):
    with RegistryServer(tmp_path / "reg", htpasswd={"alice": "s3cret"}, htpasswd_cost=4) as server:
        with RegistryStore(server.url, username="alice", password="s3cret") as store:
            assert store.put_blob(unique_repo, digest_of(b"x"), b"x") is True
            assert store.list_repositories() == [unique_repo]
        with open_store(server.url.replace("http://", "http://alice:s3cret@")) as store:
            assert store.has_blob(unique_repo, digest_of(b"x"))
        for creds in ({}, {"username": "alice", "password": "wrong"}):
            with RegistryStore(server.url, **creds) as store, pytest.raises(RegistryAuthError):
                store.has_blob(unique_repo, digest_of(b"x"))


def test_registry_serve_cli_runs_in_foreground_and_stops(tmp_path):
    cli = [sys.executable, "-m", "rollstack.cli.main", "registry", "serve",
           "--addr", "127.0.0.1:0", "--root", str(tmp_path / "reg"), "--json"]
    # SIGINT at its default in the child: a suite started in the background (`... &` without job
    # control) runs with SIGINT ignored, which every child inherits, and then Python installs no
    # KeyboardInterrupt handler (the CLI is meant to ignore Ctrl-C then, like any background job)
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        text = ""
        doc = None
        deadline = time.monotonic() + 30
        while doc is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            text += line
            try:
                doc = json.loads(text)
            except ValueError:
                continue
        assert doc is not None, proc.stderr.read() if proc.poll() is not None else text
        assert httpx.get(doc["url"] + "/v2/").status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        assert not alive(doc["pid"])  # the registry child is gone too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_registry_serve_cli_refuses_busy_port(registry, tmp_path):
    port = registry.url.rsplit(":", 1)[1]
    cli = [sys.executable, "-m", "rollstack.cli.main", "registry", "serve",
           "--addr", f"127.0.0.1:{port}", "--root", str(tmp_path / "reg")]
    res = subprocess.run(cli, capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    assert res.stderr.startswith("error: registry_unavailable:")
    assert "Traceback" not in res.stderr


def test_registry_dies_with_its_parent(tmp_path):
    """A runner killed with SIGKILL must not leak a registry (die_with_parent)."""
    code = ("import sys, time; from rollstack.store import RegistryServer; "
            f"s = RegistryServer({str(tmp_path / 'reg')!r}, die_with_parent=True).start(); "
            "print(s.process.pid, s.url, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid, url = parent.stdout.readline().split()
        assert httpx.get(url + "/v2/").status_code == 200
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(int(pid))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


class _FailSecondPatch(httpx.HTTPTransport):
    """Real transport, except the 2nd PATCH is answered 503 without reaching the registry."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PATCH":
            self.patches += 1
            if self.patches == 2:
                request.read()
                return httpx.Response(503, request=request)
        return super().handle_request(request)


def test_chunked_upload_resumes_on_real_registry(registry, unique_repo):
    data = os.urandom(3 << 20)
    transport = _FailSecondPatch()
    with RegistryStore(registry.url, chunk_size=1 << 20, transport=transport,
                       retry=RetryPolicy(retries=2, backoff=0.01)) as store:
        assert store.put_blob(unique_repo, digest_of(data), data) is True
        assert store.stats.requests["POST"] == 1  # resumed the same session (GET status), no restart
        assert transport.patches == 4
        assert store.read_blob(unique_repo, digest_of(data), 0, 3 << 20) == data
