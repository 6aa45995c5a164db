"""Resolution: a plan's group references -> the ordered list of layer blobs to stack.

`Resolver(store, cache_dir, ttl)` maps each reference to its group manifest through a cache:
in memory, and (with `cache_dir`) on disk so other processes and restarts share it. A tag is
re-checked against the store once its cache entry is older than `ttl` seconds (if the store is
unreachable then, the stale entry is used and the failure logged); a `name@sha256:...` reference
is immutable and never re-checked. An unknown group raises GroupNotFound naming it.
`rollstack group publish` / `group import` write the tag they just set into this machine's
cache (`Resolver.remember`), so a resolution here sees a new version at once; every other cache
(other machines, a node's own cache under its root) sees it after at most `ttl` seconds.

The stack is the groups' layers concatenated bottom first. A layer digest that appears twice is
kept only at its highest position: re-applying an identical layer on top makes its lower copy
invisible (every path it names is named again above), and overlayfs refuses a directory given
twice as a lower layer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollstack.errors import FormatError, GroupNotFound, InvalidRequest, ManifestNotFound, RegistryError
from rollstack.plan import lowers
from rollstack.plan.groups import parse_group_manifest
from rollstack.plan.model import Plan, load_plan
from rollstack.plan.refs import GroupRef

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LayerRef:
    repo: str  # the repository the blob is read from (the group's name)
    digest: str
    size: int
    group: str  # the group reference as written in the plan
    erofs: str = ""  # the digest of its EROFS metadata image published beside it (plan/lowers.py)
    erofs_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"digest": self.digest, "size": self.size, "group": self.group, "repo": self.repo}
        if self.erofs:
            doc["erofs"] = {"digest": self.erofs, "size": self.erofs_size}
        return doc


@dataclass(frozen=True, slots=True)
class ResolvedGroup:
    ref: str  # as written in the plan
    name: str
    digest: str  # the manifest digest it resolved to
    layers: int

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "name": self.name, "digest": self.digest, "layers": self.layers}


@dataclass(frozen=True, slots=True)
class ResolvedStack:
    layers: list[LayerRef]  # bottom first
    groups: list[ResolvedGroup]
    evaluator: "ResolvedStack | None" = None
    seconds: float = 0.0
    cache_hits: int = field(default=0, compare=False)

    @property
    def stack_digest(self) -> str:
        """sha256 over the ordered layer digests: equal stacks, equal digests."""
        h = hashlib.sha256()
        for layer in self.layers:
            h.update(layer.digest.encode() + b"\n")
        return "sha256:" + h.hexdigest()

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "layers": [layer.to_dict() for layer in self.layers],
            "groups": [g.to_dict() for g in self.groups],
            "stack_digest": self.stack_digest,
            "size": self.size,
        }
        if self.evaluator is not None:
            doc["evaluator"] = self.evaluator.to_dict()
        return doc


@dataclass(slots=True)
class _Entry:
    digest: str
    layers: list[tuple[str, int]]
    fetched: float  # time.time() of the last check against the store
    images: dict[str, tuple[str, int]] = field(default_factory=dict)  # layer -> its EROFS image


class Resolver:
    """Thread-safe. One per node (or per CLI call); share `cache_dir` between processes freely."""

    def __init__(self, store: Any, cache_dir: Path | None = None, ttl: float = 60.0) -> None:
        self.store = store
        self.ttl = ttl
        self.cache_dir = Path(cache_dir) / "groups" if cache_dir else None
        self._memory: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self.store_lookups = 0  # manifests fetched from the store (tests, stats)

    # -- public ------------------------------------------------------------------------------
    def resolve(self, plan: Plan | dict[str, Any] | str | Path) -> ResolvedStack:
        """The plan's stack (and its evaluator's, as `.evaluator`)."""
        plan = plan if isinstance(plan, Plan) else load_plan(plan)
        stack = self.resolve_groups(plan.groups)
        if plan.evaluator is not None:
            ev = self.resolve_groups(plan.evaluator.groups)
            stack = ResolvedStack(stack.layers, stack.groups, ev, stack.seconds + ev.seconds, stack.cache_hits)
        return stack

    def resolve_groups(self, refs: list[str]) -> ResolvedStack:
        start = time.perf_counter()
        groups: list[ResolvedGroup] = []
        layers: list[LayerRef] = []
        hits = 0
        for text in refs:
            ref = GroupRef.parse(text)
            entry, hit = self._entry(ref, text)
            hits += hit
            groups.append(ResolvedGroup(text, ref.name, entry.digest, len(entry.layers)))
            layers.extend(LayerRef(ref.name, digest, size, text, *entry.images.get(digest, ("", 0)))
                          for digest, size in entry.layers)
        return ResolvedStack(_dedupe(layers), groups, None, time.perf_counter() - start, hits)

    def remember(self, name_tag: str, digest: str, layers: list[tuple[str, int]],
                 images: dict[str, tuple[str, int]] | None = None) -> None:
        """Record that tag `name_tag` names group manifest `digest` now (what `group publish`
        and `group import` just wrote), so a resolution on this machine sees the new version at
        once instead of after the TTL. Other machines' caches still re-check only after their TTL."""
        ref = GroupRef.parse(name_tag)
        if ref.pinned:
            raise InvalidRequest(f"{name_tag!r}: remember a tag, not a digest")
        entry = _Entry(digest, [(str(d), int(size)) for d, size in layers], time.time(), dict(images or {}))
        key = self._key(ref)
        with self._lock:
            self._memory[key] = entry
            self._save(key, entry)

    # -- cache -------------------------------------------------------------------------------
    def _key(self, ref: GroupRef) -> str:
        return hashlib.sha256(f"{self.store.url}\n{ref.name}\n{ref.ref}".encode()).hexdigest()

    def _entry(self, ref: GroupRef, text: str) -> tuple[_Entry, bool]:
        key = self._key(ref)
        with self._lock:
            entry = self._memory.get(key) or self._load(key)
        now = time.time()
        if entry is not None and (ref.pinned or now - entry.fetched < self.ttl):
            return entry, True
        try:
            fresh = self._fetch(ref, text)
        except RegistryError as exc:
            if entry is None:
                raise
            log.warning("re-checking %s failed (%s); using the cached resolution", text, exc)
            return entry, True
        with self._lock:
            self._memory[key] = fresh
            self._save(key, fresh)
        return fresh, False

    def _fetch(self, ref: GroupRef, text: str) -> _Entry:
        self.store_lookups += 1
        try:
            manifest = self.store.get_manifest(ref.name, ref.ref)
        except ManifestNotFound:
            raise GroupNotFound(f"group {text!r} not found in {self.store.url}", group=text) from None
        except Exception as exc:  # noqa: BLE001 - registries answer unknown repos in many ways
            if getattr(exc, "code", "") in ("not_found", "blob_not_found", "manifest_not_found"):
                raise GroupNotFound(f"group {text!r} not found in {self.store.url}", group=text) from None
            raise
        doc = parse_group_manifest(manifest.data)
        if doc is None:
            raise FormatError(f"{text!r} is not a rollstack group (convert images with `rollstack group import`)")
        if ref.pinned and manifest.digest != ref.digest:
            raise FormatError(f"{text!r}: the store returned manifest {manifest.digest}")
        layers = [(str(layer["digest"]), int(layer["size"])) for layer in lowers.layer_descriptors(doc)]
        return _Entry(manifest.digest, layers, time.time(), lowers.image_descriptors(doc))

    def _path(self, key: str) -> Path | None:
        return self.cache_dir / f"{key}.json" if self.cache_dir else None

    def _load(self, key: str) -> _Entry | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            doc = json.loads(path.read_text())
            entry = _Entry(doc["digest"], [(d, int(s)) for d, s in doc["layers"]], float(doc["fetched"]),
                           {k: (str(v[0]), int(v[1])) for k, v in (doc.get("images") or {}).items()})
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self._memory[key] = entry
        return entry

    def _save(self, key: str, entry: _Entry) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                json.dump({"digest": entry.digest, "layers": entry.layers, "fetched": entry.fetched,
                           "images": entry.images}, f)
            os.replace(tmp, path)
        except OSError as exc:  # the cache is an optimisation: never fail a resolution over it
            log.warning("cannot write resolve cache %s: %s", path, exc)


def default_cache_dir() -> Path:
    """Where the CLI keeps resolutions and import conversions: `$XDG_CACHE_HOME/rollstack`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "rollstack"


def _dedupe(layers: list[LayerRef]) -> list[LayerRef]:
    highest = {layer.digest: i for i, layer in enumerate(layers)}
    return [layer for i, layer in enumerate(layers) if highest[layer.digest] == i]
