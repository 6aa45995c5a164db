"""The demo's publish cache on a tiny corpus and a real OCI layout store: convert once, then skip;
republish what was rebuilt, and everything when the store lost it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rollstack_corpus.cache import LoadedCorpus
from rollstack_corpus.publish import publish_corpus_groups
from rollstack.plan.groups import list_groups
from rollstack.store import open_store

pytestmark = pytest.mark.integration


def _tree(root: Path, files: dict[str, str]) -> None:
    shutil.rmtree(root, ignore_errors=True)
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _corpus(root: Path) -> LoadedCorpus:
    comps = [
        {"name": "os", "kind": "os", "group": "os/tiny:1", "bytes": 3, "files": 1},
        {"name": "repo-app", "kind": "repo", "group": "repo/app:1", "bytes": 6, "files": 1},
    ]
    (root / ".stamps").mkdir(parents=True, exist_ok=True)
    (root / ".stamps" / "os").write_text("k1\n")
    return LoadedCorpus(root=root, manifest={"flavor": "small", "components": comps}, tasks=[], seconds=0.0)


def test_publish_converts_once_then_skips_until_a_tree_or_the_store_changes(tmp_path: Path) -> None:
    corpus_root = tmp_path / "corpus"
    _tree(corpus_root / "os", {"etc/os-release": "os\n"})
    _tree(corpus_root / "repo-app", {"work/app/a.py": "x = 1\n"})
    corpus = _corpus(corpus_root)
    spec = f"oci:{tmp_path / 'store'}"
    cache, scratch = tmp_path / "state" / "published.json", tmp_path / "state" / "scratch"
    logs: list[str] = []

    def layers() -> dict[str, list[str]]:
        store = open_store(spec)
        try:
            return {f"{g.name}:{g.tag}": g.layer_digests for g in list_groups(store)}
        finally:
            store.close()

    def publish() -> dict[str, object]:
        store = open_store(spec)
        try:
            return {p.component: p for p in publish_corpus_groups(corpus, store, spec, cache, scratch, logs.append)}
        finally:
            store.close()

    first = publish()
    assert not any(p.cached for p in first.values())
    assert all(p.uploaded_bytes > 0 and p.digest.startswith("sha256:") for p in first.values())
    assert not scratch.exists()  # conversion space is removed
    first_layers = layers()

    second = publish()
    assert all(p.cached and p.uploaded_bytes == 0 for p in second.values())
    assert {c: p.digest for c, p in second.items()} == {c: p.digest for c, p in first.items()}
    assert second["os"].size == first["os"].size

    _tree(corpus_root / "repo-app", {"work/app/a.py": "x = 2\n"})  # the builder rebuilt one component
    third = publish()
    assert third["os"].cached and not third["repo-app"].cached
    assert third["repo-app"].digest != first["repo-app"].digest

    shutil.rmtree(tmp_path / "store")  # the store was wiped: the cache must not be trusted
    fourth = publish()
    assert not any(p.cached for p in fourth.values())
    # deterministic conversion: the same tree gives the same layer bytes (the manifest differs
    # only by its `created` second)
    assert layers()["os/tiny:1"] == first_layers["os/tiny:1"]


def test_a_corrupt_cache_file_is_ignored(tmp_path: Path) -> None:
    corpus_root = tmp_path / "corpus"
    _tree(corpus_root / "os", {"etc/os-release": "os\n"})
    _tree(corpus_root / "repo-app", {"work/app/a.py": "x = 1\n"})
    cache = tmp_path / "published.json"
    cache.write_text("{not json")
    spec = f"oci:{tmp_path / 'store'}"
    store = open_store(spec)
    try:
        out = publish_corpus_groups(_corpus(corpus_root), store, spec, cache, tmp_path / "scratch", lambda m: None)
    finally:
        store.close()
    assert len(out) == 2 and not any(p.cached for p in out)
