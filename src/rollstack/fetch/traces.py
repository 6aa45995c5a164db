"""Access traces: which chunks an environment read during its first seconds, by trace key.

A key names "the same work" (e.g. stack digest + task id: the rollouts of one GRPO group). The
first environment with a key records its demand reads for `window` seconds; later ones prefetch
that list in parallel the moment they are created. Persisted as one small JSON file per key
under the state directory, written atomically, so traces survive daemon restarts.

`TraceChunk` is the one typed form of a trace entry (layer digest + the chunk it read). Its
document form, `[layer digest, {"o", "s", "bo", "bs", "d", "c"}]`, is the schema of the files
here and of the artifacts `fetch.shared_traces` publishes; it is spelled only in this module.
The store does blocking file I/O: callers on an event loop run it in worker threads.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollstack.errors import InvalidRequest
from rollstack.format.toc import Chunk, Compression

if TYPE_CHECKING:
    from rollstack.plan.model import Plan

MAX_CHUNK_BYTES = 1 << 30
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_COMPRESSIONS = {c.value: c for c in Compression}


@dataclass(frozen=True, slots=True)
class TraceChunk:
    """One chunk of a layer an environment read, in enough detail to fetch it without a TOC."""

    layer: str  # the layer's digest
    chunk: Chunk

    @property
    def key(self) -> tuple[str, int]:
        """(layer, blob offset): a chunk's identity inside a trace."""
        return self.layer, self.chunk.blob_offset

    def to_doc(self) -> list[Any]:
        c = self.chunk
        return [self.layer, {"o": c.offset, "s": c.size, "bo": c.blob_offset, "bs": c.blob_size, "d": c.digest,
                             "c": c.compression.value}]

    @classmethod
    def from_doc(cls, item: Any, blob_size: int | None = None) -> "TraceChunk":
        """The entry a document describes, or InvalidRequest (strict: documents may come from
        another node). With `blob_size`, the chunk must also lie inside its layer's blob."""
        if not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str):
            raise InvalidRequest("trace: an entry is not [layer digest, chunk]")
        layer, doc = item
        if not isinstance(doc, dict):
            raise InvalidRequest("trace: a chunk is not an object")
        o, s = _int(doc, "o", 0, 1 << 62), _int(doc, "s", 1, MAX_CHUNK_BYTES)
        bo, bs = _int(doc, "bo", 0, 1 << 62), _int(doc, "bs", 1, MAX_CHUNK_BYTES)
        if blob_size is not None and bo + bs > blob_size:
            raise InvalidRequest("trace: a chunk lies outside its layer blob")
        d, c = doc.get("d"), doc.get("c")
        if not isinstance(d, str) or not DIGEST.fullmatch(d):
            raise InvalidRequest("trace: a chunk digest is malformed")
        if not isinstance(c, str) or c not in _COMPRESSIONS:
            raise InvalidRequest("trace: unknown chunk compression")
        return cls(layer, Chunk(offset=o, size=s, blob_offset=bo, blob_size=bs, digest=d, compression=_COMPRESSIONS[c]))


def _int(doc: dict, name: str, lo: int, hi: int) -> int:
    v = doc.get(name)
    if type(v) is not int or not lo <= v <= hi:
        raise InvalidRequest(f"trace: chunk field {name!r} is not an integer in [{lo}, {hi}]")
    return v


Trace = list[TraceChunk]
"""A trace: its chunks in first-read order, each (layer, blob offset) once."""


@dataclass
class TraceRecorder:
    key: str
    window: float
    max_chunks: int
    started: float = field(default_factory=time.monotonic)
    chunks: dict[tuple[str, int], TraceChunk] = field(default_factory=dict)

    def record(self, layer_digest: str, chunk: Chunk) -> None:
        if len(self.chunks) < self.max_chunks and time.monotonic() - self.started <= self.window:
            k = (layer_digest, chunk.blob_offset)
            if k not in self.chunks:
                self.chunks[k] = TraceChunk(layer_digest, chunk)

    @property
    def open(self) -> bool:
        return time.monotonic() - self.started <= self.window


class TraceStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def load(self, key: str) -> Trace:
        """The stored trace of `key` ([] when there is none or it is unreadable)."""
        try:
            doc = json.loads(self._path(key).read_text())
        except (FileNotFoundError, ValueError):
            return []
        if not isinstance(doc, dict) or doc.get("key") != key:
            return []
        try:
            return [TraceChunk.from_doc(item) for item in doc.get("chunks", [])]
        except InvalidRequest:
            return []

    def put(self, key: str, entries: Trace, max_chunks: int) -> int:
        """Stores a trace obtained elsewhere (e.g. shared through the artifact store)."""
        rec = TraceRecorder(key, 0.0, max_chunks)
        for t in entries[:max_chunks]:
            rec.chunks.setdefault(t.key, t)
        return self.save(rec)

    def save(self, recorder: TraceRecorder) -> int:
        """Merges the recorder into the stored trace (first-seen order kept); returns its size.
        Not safe against a concurrent save of the same key: callers serialise their writes."""
        merged = {t.key: t for t in self.load(recorder.key)}
        for k, t in recorder.chunks.items():
            merged.setdefault(k, t)
        items = [t.to_doc() for t in merged.values()][: recorder.max_chunks]
        path = self._path(recorder.key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": recorder.key, "saved": time.time(), "chunks": items}))
        os.replace(tmp, path)
        return len(items)


def trace_keys(stack_digest: str | None, plan: "Plan") -> tuple[str | None, str | None]:
    """(task key, stack key) of the lazy store's access traces: the rollouts of one task (same
    stack and mutation: a GRPO group; plan names usually differ per rollout, so they are left
    out) share the first; every task on the stack, the second (what the first seconds of any
    environment of that stack read)."""
    if not stack_digest:
        return None, None
    task = hashlib.sha256((plan.mutation_text or "").encode()).hexdigest()[:24]
    return f"{stack_digest}/task/{task}", f"{stack_digest}/stack"
