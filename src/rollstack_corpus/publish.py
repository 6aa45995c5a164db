"""Publishing the corpus's components as layer groups, with a publish cache.

Publishing is idempotent (same tree -> same blob digests -> nothing uploaded), but converting a
700 MB tree still costs CPU. So a small JSON cache (`DemoConfig.publish_cache`) remembers, per
store and group, which build of the component (the builder's stamp plus the tree directory's
identity) produced which manifest digest; a later run whose store still holds that digest under
the tag skips the conversion. Conversions run two at a time (zstd releases the GIL); uploads and
tagging run one at a time, since an OCI layout's index.json is one shared file.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rollstack_corpus.cache import LoadedCorpus
from rollstack.errors import NotFound
from rollstack.plan import lowers


@dataclass
class PublishedGroup:
    component: str
    group: str
    digest: str
    size: int
    """bytes of its layer blobs (compressed)"""
    tree_bytes: int
    """bytes of the component's files (uncompressed)"""
    uploaded_bytes: int
    cached: bool
    """True: the publish cache said this build is in the store already (nothing converted)"""
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_key(corpus: LoadedCorpus, component: dict[str, Any]) -> str:
    """Changes whenever the builder rebuilds the component's tree (or the EROFS image version
    published beside its layers changes)."""
    tree = corpus.component_dir(component["name"])
    st = tree.stat()
    return (f"{corpus.stamp(component['name'])}|{st.st_ino}|{st.st_mtime_ns}|{component['bytes']}|{component['files']}"
            f"|{lowers.IMAGE_MEDIA_TYPE}")


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _save_cache(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _still_there(store: Any, group: str, digest: str) -> int | None:
    """The group's layer bytes if `group` still names manifest `digest` in the store, else None."""
    from rollstack.plan.groups import parse_group_manifest, split_name_tag

    name, tag = split_name_tag(group)
    try:
        manifest = store.get_manifest(name, tag)
    except NotFound:  # anything else (an unreachable registry, bad credentials) is the caller's error
        return None
    if manifest.digest != digest:
        return None
    doc = parse_group_manifest(manifest.data) or {}
    if not all(store.has_blob(name, layer["digest"]) for layer in doc.get("layers") or []):
        return None
    return sum(int(layer.get("size", 0)) for layer in lowers.layer_descriptors(doc))


def publish_corpus_groups(corpus: LoadedCorpus, store: Any, store_key: str, cache_path: Path, scratch: Path,
                          log: Callable[[str], None]) -> list[PublishedGroup]:
    """Every component of `corpus` as its group in `store`; returns what each cost."""
    from rollstack.plan.groups import convert_sources, publish_layers, split_name_tag


    # Probe the store before converting anything: an unreachable registry fails in a second, not
    # after minutes of conversion.
    _still_there(store, corpus.manifest["components"][0]["group"], "")
    cache = _load_cache(cache_path)
    known = cache.setdefault(store_key, {})
    out: dict[str, PublishedGroup] = {}
    todo: list[dict[str, Any]] = []
    for comp in corpus.manifest["components"]:
        t0 = time.monotonic()
        key = build_key(corpus, comp)
        hit = known.get(comp["group"])
        size = _still_there(store, comp["group"], hit["digest"]) if hit and hit.get("key") == key else None
        if size is not None:
            out[comp["name"]] = PublishedGroup(comp["name"], comp["group"], hit["digest"], size, comp["bytes"], 0,
                                               True, time.monotonic() - t0)
            log(f"publish {comp['group']}: cached ({hit['digest'][:19]})")
        else:
            todo.append(comp)

    def convert(comp: dict[str, Any]) -> tuple[dict[str, Any], Path, list[Any], float]:
        t0 = time.monotonic()
        work = scratch / comp["name"]
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log(f"publish {comp['group']}: converting {comp['bytes'] / 1e6:.0f} MB, {comp['files']} files")
        return comp, work, convert_sources([corpus.component_dir(comp["name"])], work), t0

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for comp, work, layers, t0 in pool.map(convert, todo):
                name, tag = split_name_tag(comp["group"])
                res = publish_layers(store, name, tag, layers, kind=comp["kind"])
                shutil.rmtree(work, ignore_errors=True)
                size = sum(int(layer["size"]) for layer in res.layers)
                pub = PublishedGroup(comp["name"], comp["group"], res.digest, size, comp["bytes"],
                                     res.uploaded_bytes, False, time.monotonic() - t0)
                out[comp["name"]] = pub
                known[comp["group"]] = {"key": build_key(corpus, comp), "digest": res.digest}
                _save_cache(cache_path, cache)
                log(f"publish {comp['group']}: {res.digest[:19]}, uploaded {res.uploaded_bytes / 1e6:.1f} MB "
                    f"in {pub.seconds:.1f} s" + (" (unchanged)" if res.unchanged else ""))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _save_cache(cache_path, cache)
    return [out[c["name"]] for c in corpus.manifest["components"]]
