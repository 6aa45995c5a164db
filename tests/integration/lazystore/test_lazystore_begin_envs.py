"""`POST /v1/envs`: a GRPO group's environments begun in the lazy store with one request (real
daemon, FUSE mount, registry-backed layers, environment cgroups): each gets its own account and
trace work as `begin_env` gives one; bad bodies get a clear 400 and change nothing."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
from lazystore_fixtures import FILES, build_tree, publish, run_in

from rollstack.errors import InvalidRequest
from rollstack.lazystore.wire import MAX_GROUP

pytestmark = pytest.mark.integration


def _ids(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"g{tag}-{i}" for i in range(n)]


def test_a_group_is_begun_at_once_with_its_own_accounts_and_traces(tmp_path, oci_store, lazy_factory,
                                                                   env_cgroups):
    tree = build_tree(tmp_path / "src", big_mib=1)
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/group")
    refs = [{"repo": "test/group", "digest": digest}]
    lazy = lazy_factory(oci_store.url, neighbor_bytes=0)
    top = lazy.layer_dir(digest)
    argv = ["cat", *[str(top / f) for f in FILES]]
    want = b"".join((tree / f).read_bytes() for f in FILES)
    key = f"stack/task/{uuid.uuid4().hex[:6]}"

    first = _ids(3)
    began = lazy.begin_envs(first, refs, trace_key=key, fallback_key="stack", background=False)
    assert [e["env_id"] for e in began["envs"]] == first
    assert [layer["digest"] for layer in began["layers"]["layers"]] == [digest]
    assert all(e["trace_source"] is None for e in began["envs"])  # no trace of this task yet
    assert lazy.stats()["environments"] == 3
    assert run_in(env_cgroups(first[0]), argv) == want  # only the first one reads
    stats = [lazy.env_stats(e) for e in first]
    assert stats[0]["read_bytes"]["registry"] + stats[0]["read_bytes"]["memory"] == len(want)
    assert all(sum(s["read_bytes"].values()) == 0 for s in stats[1:])  # accounts are per environment
    assert all(s["trace_recording"] for s in stats)  # each records, as one begin_env would
    ended = lazy.end_env(first[0])  # its recording is saved: the task now has a trace here
    assert ended["critical_path_bytes"] > 0
    for e in first[1:]:
        lazy.end_env(e)

    second = _ids(4)
    again = lazy.begin_envs(second, refs, trace_key=key, fallback_key="stack", background=False)
    assert [e["trace_source"] for e in again["envs"]] == ["local"] * 4  # read once, used by all
    assert all(e["trace_prefetch_chunks"] >= len(FILES) for e in again["envs"])
    for e in second:
        assert lazy.env_stats(e)["trace_key"] == key
        lazy.end_env(e)
    assert lazy.stats()["environments"] == 0


def _post(lazy, body: bytes | str) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(lazy.socket_path)), base_url="http://lazystore",
                      timeout=30) as c:
        return c.post("/v1/envs", content=body, headers={"content-type": "application/json"})


def test_bad_group_bodies_get_a_clear_400_and_the_daemon_stays_up(tmp_path, oci_store, lazy_factory):
    tree = build_tree(tmp_path / "src", big_mib=1)
    digest = publish(oci_store, tree, tmp_path / "layer.blob", "test/badgroup")
    layers = [{"repo": "test/badgroup", "digest": digest}]
    lazy = lazy_factory(oci_store.url, neighbor_bytes=0)
    dup = _ids(1) * 2
    cases = {
        "empty list": ({"ids": [], "layers": layers}, "ids"),
        "too many": ({"ids": [f"e{i}" for i in range(MAX_GROUP + 1)], "layers": layers}, "ids"),
        "duplicate ids": ({"ids": dup, "layers": layers}, "duplicate"),
        "a slash in an id": ({"ids": ["ok", "a/b"], "layers": layers}, "ids"),
        "ids not a list": ({"ids": "e1", "layers": layers}, "ids"),
        "no layers": ({"ids": ["e1"]}, "layers"),
        "an unknown field": ({"ids": ["e1"], "layers": layers, "nope": 1}, "nope"),
    }
    for name, (body, word) in cases.items():
        resp = _post(lazy, json.dumps(body))
        assert resp.status_code == 400, (name, resp.text)
        err = resp.json()["error"]
        assert err["code"] == "invalid_request" and word in err["message"], (name, err)
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        resp = _post(lazy, raw)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request", resp.text
    with pytest.raises(InvalidRequest):  # the client refuses what the daemon would
        lazy.begin_envs([], layers)
    with pytest.raises(InvalidRequest, match="duplicate"):
        lazy.begin_envs(dup, layers)
    # a layer the registry does not have: an error for the whole group, no environment begun
    missing = [{"repo": "test/badgroup", "digest": "sha256:" + "0" * 64}]
    resp = _post(lazy, json.dumps({"ids": _ids(2), "layers": missing}))
    assert 400 <= resp.status_code < 500, resp.text
    assert lazy.healthy() and lazy.stats()["environments"] == 0
    ok = _ids(2)
    assert [e["env_id"] for e in lazy.begin_envs(ok, layers, background=False)["envs"]] == ok
    for e in ok:
        lazy.end_env(e)
    deadline = time.monotonic() + 30
    while lazy.stats()["environments"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lazy.stats()["environments"] == 0
