"""Resolver over an in-memory store: order, dedupe, stack digest, TTL, pinning, stale fallback."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rollstack.errors import FormatError, GroupNotFound, ManifestNotFound, RegistryUnavailable
from rollstack.plan.groups import GROUP_ARTIFACT_TYPE
from rollstack.plan.resolve import Resolver
from rollstack.store.base import Manifest


class FakeStore:
    url = "fake:"

    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str], Manifest] = {}
        self.down = False
        self.calls = 0

    def tag(self, repo: str, tag: str, layers: list[str], artifact: str = GROUP_ARTIFACT_TYPE) -> str:
        data = json.dumps({"schemaVersion": 2, "artifactType": artifact,
                           "layers": [{"digest": d, "size": len(d)} for d in layers]}).encode()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        m = Manifest(digest, "application/vnd.oci.image.manifest.v1+json", data)
        self.manifests[(repo, tag)] = self.manifests[(repo, digest)] = m
        return digest

    def get_manifest(self, repo: str, ref: str) -> Manifest:
        self.calls += 1
        if self.down:
            raise RegistryUnavailable("down")
        try:
            return self.manifests[(repo, ref)]
        except KeyError:
            raise ManifestNotFound(f"{repo}:{ref}") from None


def D(x: str) -> str:
    return "sha256:" + x * 64


def test_order_dedupe_and_digest():
    s = FakeStore()
    s.tag("os/base", "1", [D("a"), D("b")])
    s.tag("repo/x", "1", [D("b"), D("c")])
    stack = Resolver(s).resolve_groups(["os/base:1", "repo/x:1"])
    assert [(layer.digest, layer.group) for layer in stack.layers] == [(D("a"), "os/base:1"), (D("b"), "repo/x:1"), (D("c"), "repo/x:1")]
    again = Resolver(s).resolve_groups(["os/base:1", "repo/x:1"])
    assert again.stack_digest == stack.stack_digest
    assert Resolver(s).resolve_groups(["repo/x:1", "os/base:1"]).stack_digest != stack.stack_digest


def test_ttl_pinning_and_stale_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    s = FakeStore()
    first = s.tag("h/a", "1", [D("a")])
    clock = [1000.0]
    r = Resolver(s, tmp_path, ttl=10)
    with monkeypatch.context() as m:
        m.setattr("rollstack.plan.resolve.time.time", lambda: clock[0])
        r.resolve_groups(["h/a:1"])
        s.tag("h/a", "1", [D("b")])
        assert r.resolve_groups(["h/a:1"]).layers[0].digest == D("a")  # fresh cache
        clock[0] += 11
        assert r.resolve_groups(["h/a:1"]).layers[0].digest == D("b")  # re-checked
        clock[0] += 11
        s.down = True
        assert r.resolve_groups(["h/a:1"]).layers[0].digest == D("b")  # stale beats down
    s.down = False
    pinned = Resolver(s, tmp_path, ttl=0)
    pinned.resolve_groups([f"h/a@{first}"])
    calls = s.calls
    pinned.resolve_groups([f"h/a@{first}"])
    assert s.calls == calls  # digests are never re-checked
    s.down = True
    with pytest.raises(RegistryUnavailable):
        Resolver(s).resolve_groups(["h/a:1"])  # nothing cached: the failure shows


def test_errors():
    s = FakeStore()
    s.tag("img/x", "1", [D("a")], artifact="application/vnd.oci.image.config.v1+json")
    with pytest.raises(GroupNotFound, match="'no/pe:1'"):
        Resolver(s).resolve_groups(["no/pe:1"])
    with pytest.raises(FormatError, match="not a rollstack group"):
        Resolver(s).resolve_groups(["img/x:1"])


def test_resolve_plan_with_evaluator():
    s = FakeStore()
    s.tag("os/base", "1", [D("a")])
    s.tag("ev/t", "1", [D("e")])
    stack = Resolver(s).resolve({"groups": ["os/base:1"], "evaluator": {"groups": ["os/base:1", "ev/t:1"], "command": ["true"]}})
    assert [layer.digest for layer in stack.evaluator.layers] == [D("a"), D("e")]
    assert stack.to_dict()["evaluator"]["stack_digest"] == stack.evaluator.stack_digest


def test_publishing_a_new_version_is_resolved_at_once_on_this_machine(tmp_path, capsys) -> None:
    """`group publish` writes the tag it set into the resolution cache: `plan resolve` with the
    default 60 s TTL sees the new version immediately (it returned the old one for up to 60 s)."""
    import json as json_

    from rollstack.cli.main import main

    store, cache = f"oci:{tmp_path / 'store'}", str(tmp_path / "cache")
    plan = tmp_path / "plan.yaml"
    plan.write_text("groups: [harness/agent:1]\n")

    def publish(content: str) -> str:
        src = tmp_path / f"src-{content}"
        src.mkdir()
        (src / "agent.py").write_text(content)
        assert main(["group", "publish", "harness/agent:1", str(src), "--store", store, "--cache-dir", cache,
                     "--json"]) == 0
        return json_.loads(capsys.readouterr().out)["digest"]

    def resolved() -> str:
        assert main(["plan", "resolve", str(plan), "--store", store, "--cache-dir", cache, "--json"]) == 0
        return json_.loads(capsys.readouterr().out)["groups"][0]["digest"]

    first = publish("v1\n")
    assert resolved() == first
    second = publish("v2\n")
    assert second != first and resolved() == second


def test_remember_refuses_a_pinned_reference(tmp_path) -> None:
    from rollstack.errors import InvalidRequest
    from rollstack.plan.resolve import Resolver
    from rollstack.store.ocilayout import OciLayoutStore

    with pytest.raises(InvalidRequest):
        Resolver(OciLayoutStore(tmp_path / "s"), tmp_path / "c").remember("a/b@sha256:" + "0" * 64, "sha256:x", [])
