"""The E2B surface at the wire level, with plain httpx: Connect framing (envelopes, the
end-stream message), malformed and oversized messages, a client that drops a stream, unknown
sandboxes, wrong keys; always an E2B- or Connect-shaped error, never a traceback, nothing left.
"""

from __future__ import annotations

import json
import struct
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.integration

from e2b import Sandbox  # noqa: E402

START = "/process.Process/Start"
LIST = "/process.Process/List"


def frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def frames(body: bytes) -> list[tuple[int, dict]]:
    out, i = [], 0
    while i < len(body):
        flags, n = struct.unpack(">BI", body[i:i + 5])
        out.append((flags, json.loads(body[i + 5:i + 5 + n] or b"{}")))
        i += 5 + n
    assert i == len(body), "trailing bytes after the last envelope"
    return out


@pytest.fixture
def raw(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=120)
    headers = {"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": box._envd_access_token}
    with httpx.Client(base_url=e2b_node.url, headers=headers, timeout=30) as client:
        yield box, client
    box.kill()
    root = e2b_node.root / "envs" / box.sandbox_id
    deadline = time.monotonic() + 10
    while root.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not root.exists(), "the killed sandbox left its environment directory"
    with open("/proc/self/mountinfo") as f:
        assert str(root) not in f.read()
    def mine() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(f"rollstack-e2b-{box.sandbox_id}-")]

    while mine() and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    assert mine() == [], "process threads outlived their sandbox"


def test_a_killed_sandbox_ends_its_running_processes(e2b_node, raw):
    box, client = raw
    for _ in range(3):
        box.commands.run("sleep 300", background=True, timeout=0)
    assert len(client.post(LIST, json={}).json()["processes"]) == 3
    # the fixture kills the sandbox and checks that no process thread, dir or mount is left


def _start(client: httpx.Client, command: str, **headers: str) -> httpx.Response:
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", command]}, "stdin": False}
    return client.post(START, content=frame(json.dumps(msg).encode()),
                       headers={"Content-Type": "application/connect+json", **headers})


def test_start_stream_is_framed_per_the_connect_spec(raw):
    _, client = raw
    r = _start(client, "echo one; exit 5")
    assert r.status_code == 200 and r.headers["content-type"] == "application/connect+json"
    got = frames(r.content)
    assert [f for f, _ in got] == [0] * (len(got) - 1) + [2]  # data frames, then end-stream (0x02)
    events = [m["event"] for f, m in got if f == 0]
    assert "start" in events[0] and events[0]["start"]["pid"] > 0
    assert any("data" in e for e in events)
    assert events[-1]["end"] == {"exitCode": 5, "exited": True, "status": "exit status 5"}
    assert got[-1][1] == {}  # a clean end: no error in the end-stream message


@pytest.mark.parametrize("body", [
    b"\x00\x00\x00",                               # a cut envelope header
    frame(b"{not json"),                           # a well-framed message that is no JSON
    frame(b'{"process": {"cmd": 7}}'),             # JSON of the wrong shape
    frame(b"{}")[:-1],                             # payload shorter than its length
    b"\x01" + frame(b"{}")[1:],                    # compressed flag without compression
])
def test_malformed_connect_frames_end_the_stream_with_an_error(raw, body):
    _, client = raw
    r = client.post(START, content=body, headers={"Content-Type": "application/connect+json"})
    assert b"Traceback" not in r.content
    if r.status_code == 200:
        flags, end = frames(r.content)[-1]
        assert flags == 2 and end["error"]["code"] in ("invalid_argument", "internal", "unimplemented")
    else:
        assert r.status_code in (400, 415)
    assert client.post(LIST, json={}).json() == {}  # no process was started


def test_oversized_messages_are_refused(raw):
    _, client = raw
    big = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "x" * (9 << 20)]}}).encode()
    r = client.post(START, content=frame(big), headers={"Content-Type": "application/connect+json"})
    flags, end = frames(r.content)[-1]
    assert flags == 2 and end["error"]["code"] == "resource_exhausted"
    r = client.post("/filesystem.Filesystem/Stat", content=b'{"path": "' + b"a" * (9 << 20) + b'"}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 429 and r.json()["code"] == "resource_exhausted"
    r = client.post(LIST, content=b"{", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"


def test_a_dropped_stream_leaves_the_process_to_its_deadline(raw):
    _, client = raw
    msg = {"process": {"cmd": "/bin/sh", "args": ["-c", "echo up; sleep 60"]}, "stdin": False}
    with client.stream("POST", START, content=frame(json.dumps(msg).encode()),
                       headers={"Content-Type": "application/connect+json", "Connect-Timeout-Ms": "2500"}) as r:
        first = next(r.iter_bytes())
        pid = json.loads(first[5:5 + struct.unpack(">I", first[1:5])[0]])["event"]["start"]["pid"]
    # the client is gone; as with envd the command lives on until its deadline, then is killed
    assert [p["pid"] for p in client.post(LIST, json={}).json()["processes"]] == [pid]
    deadline = time.monotonic() + 15
    while client.post(LIST, json={}).json().get("processes") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.post(LIST, json={}).json() == {}


def test_envd_routes_answer_like_the_edge_proxy(e2b_node, raw):
    box, client = raw
    r = client.post(LIST, json={}, headers={"E2b-Sandbox-Id": "eother0000000"})
    assert r.status_code == 502 and "was not found" in r.json()["message"] and r.json()["code"] == 502
    r = client.get("/health", headers={"E2b-Sandbox-Id": "eother0000000"})
    assert r.status_code == 502
    r = client.post(LIST, json={}, headers={"X-Access-Token": "wrong"})
    assert r.status_code == 401 and r.json()["code"] == 401
    r = httpx.post(e2b_node.url + LIST, json={})
    assert r.status_code == 400 and "E2b-Sandbox-Id" in r.json()["message"]
    assert client.get("/health").status_code == 204
    r = client.get("/files", params={"path": "/work/app/../../etc/passwd"})
    assert r.status_code == 400 and r.json()["code"] == 400
    r = client.post("/files", params={"path": "/tmp/g"}, content=b"not gzip",
                    headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
    assert r.status_code == 400


def test_control_plane_errors_are_e2b_shaped(e2b_node):
    url, key = e2b_node.url, {"X-API-KEY": e2b_node.token}
    r = httpx.post(url + "/v2/sandboxes", content=b"{", headers={**key, "Content-Type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}
    r = httpx.post(url + "/v2/sandboxes", json={"timeout": 5}, headers=key)
    assert r.status_code == 400 and "templateID" in r.json()["message"]
    r = httpx.post(url + "/v2/sandboxes", json={"templateID": "tasks/app:1"}, headers={"X-API-KEY": "no"})
    assert r.status_code == 401 and r.json() == {"code": 401, "message": r.json()["message"]}
    r = httpx.post(url + "/sandboxes", json={"templateID": "nope/none:0"}, headers=key)
    assert r.status_code == 404 and "template_not_found" in r.json()["message"]
    assert httpx.get(url + "/sandboxes/eunknown", headers=key).status_code == 404
    r = httpx.post(url + "/v2/sandboxes", json={"templateID": e2b_node.template, "timeout": 60}, headers=key)
    assert r.status_code == 201
    created = r.json()
    assert {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"} <= set(created)
    sid = created["sandboxID"]
    end = httpx.get(url + f"/sandboxes/{sid}", headers=key).json()["endAt"]
    assert httpx.post(url + f"/sandboxes/{sid}/refreshes", json={"duration": 5}, headers=key).status_code == 204
    assert httpx.get(url + f"/sandboxes/{sid}", headers=key).json()["endAt"] == end  # a later end is kept
    assert httpx.post(url + f"/sandboxes/{sid}/refreshes", json={"duration": 600}, headers=key).status_code == 204
    assert httpx.get(url + f"/sandboxes/{sid}", headers=key).json()["endAt"] > end  # kept alive longer
    assert httpx.post(url + f"/sandboxes/{sid}/refreshes", json={"duration": 7200}, headers=key).status_code == 400
    assert httpx.get(url + f"/sandboxes/{sid}/logs", headers=key).status_code == 501
    assert httpx.post(url + f"/sandboxes/{sid}/pause", headers=key).status_code == 204
    r = httpx.post(url + f"/sandboxes/{sid}/fork", json={"count": 1}, headers=key)
    assert r.status_code == 409 and "environment_paused" in r.json()["message"]  # E2B-shaped
    assert httpx.post(url + f"/sandboxes/{sid}/connect", json={"timeout": 30}, headers=key).status_code == 200
    assert httpx.delete(url + f"/sandboxes/{sid}", headers=key).status_code == 204
    r = httpx.delete(url + f"/sandboxes/{sid}", headers=key)
    assert r.status_code == 404 and r.json()["code"] == 404


def test_native_api_accepts_a_template_name_and_keeps_its_errors(e2b_node):
    auth = {"Authorization": f"Bearer {e2b_node.token}"}
    r = httpx.post(e2b_node.url + "/v1/environments", json={"plan": e2b_node.template}, headers=auth, timeout=60)
    assert r.status_code == 201, r.text
    env_id = r.json()["id"]
    try:
        r = httpx.post(e2b_node.url + f"/v1/environments/{env_id}/exec", json={"command": "cat hello.txt"},
                       headers=auth)
        assert r.json()["stdout"] == "bug\n"
    finally:
        httpx.delete(e2b_node.url + f"/v1/environments/{env_id}", headers=auth)
    r = httpx.post(e2b_node.url + "/v1/environments", json={"plan": "nope/none:0"}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "template_not_found"
