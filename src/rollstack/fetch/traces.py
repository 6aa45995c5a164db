"""Access traces: which chunks an environment read during its first seconds, by trace key.

A key names "the same work" (e.g. stack digest + task id: the rollouts of one GRPO group). The
first environment with a key records its demand reads for `window` seconds; later ones prefetch
that list in parallel the moment they are created. Persisted as one small JSON file per key
under the state directory, written atomically, so traces survive daemon restarts.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TraceRecorder:
    key: str
    window: float
    max_chunks: int
    started: float = field(default_factory=time.monotonic)
    chunks: dict[tuple[str, int], dict] = field(default_factory=dict)  # (layer, blob offset) -> chunk doc

    def record(self, layer_digest: str, chunk_doc: dict) -> None:
        """`chunk_doc` describes the chunk fully (so prefetch needs no TOC index); key "bo" is
        its blob offset."""
        if len(self.chunks) < self.max_chunks and time.monotonic() - self.started <= self.window:
            self.chunks.setdefault((layer_digest, int(chunk_doc["bo"])), chunk_doc)

    @property
    def open(self) -> bool:
        return time.monotonic() - self.started <= self.window


class TraceStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def load(self, key: str) -> list[tuple[str, dict]]:
        """[(layer digest, chunk doc)] in first-read order ([] when there is no trace)."""
        try:
            doc = json.loads(self._path(key).read_text())
        except (FileNotFoundError, ValueError):
            return []
        if doc.get("key") != key:
            return []
        return [(str(d), dict(c)) for d, c in doc.get("chunks", [])]

    def put(self, key: str, entries: list[tuple[str, dict]], max_chunks: int) -> int:
        """Stores a trace obtained elsewhere (e.g. shared through the artifact store)."""
        rec = TraceRecorder(key, 0.0, max_chunks)
        for d, c in entries[:max_chunks]:
            rec.chunks.setdefault((d, int(c["bo"])), c)
        return self.save(rec)

    def save(self, recorder: TraceRecorder) -> int:
        """Merges the recorder into the stored trace (first-seen order kept); returns its size."""
        merged = {(d, int(c["bo"])): c for d, c in self.load(recorder.key)}
        for k, c in recorder.chunks.items():
            merged.setdefault(k, c)
        items = [[d, c] for (d, _), c in merged.items()][: recorder.max_chunks]
        path = self._path(recorder.key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": recorder.key, "saved": time.time(), "chunks": items}))
        os.replace(tmp, path)
        return len(items)
