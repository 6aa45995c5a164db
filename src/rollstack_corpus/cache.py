"""A built corpus, loaded: the small real corpus (`rollstack_corpus.build`) the demo and the
benchmarks stack, built once and cached.

`ensure_corpus` calls the corpus builder, which rebuilds only components whose inputs changed
(a built corpus comes back in well under a second); with `build=False` it only loads a built one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rollstack.tasks.model import Task
from rollstack.errors import InvalidRequest

FLAVOR = "small"


@dataclass(frozen=True)
class LoadedCorpus:
    root: Path
    """The corpus directory (component trees, tasks.jsonl, manifest.json)."""
    manifest: dict[str, Any]
    """manifest.json: components (name, kind, group, bytes, files), task counts"""
    tasks: list[Task]
    """tasks.jsonl in the SWE-smith schema (patch = the bug, fix = its reverse)"""
    seconds: float
    """Time this call took (the first build dominates the demo's first run)."""

    def component_dir(self, name: str) -> Path:
        return self.root / name

    def stamp(self, name: str) -> str:
        """The builder's cache key for component `name` ('' if unknown): changes when it is rebuilt."""
        path = self.root / ".stamps" / name
        try:
            return path.read_text().strip()
        except OSError:
            return ""


def ensure_corpus(corpus_dir: Path | None, build: bool, log: Callable[[str], None]) -> LoadedCorpus:
    from rollstack_corpus.build import build_corpus, corpus_dir as default_dir, load_corpus

    t0 = time.monotonic()
    root = default_dir(FLAVOR, corpus_dir)
    if build:
        build_corpus(FLAVOR, corpus_dir, log=lambda m: log(f"corpus: {m}"))
    elif not (root / "manifest.json").exists():
        raise InvalidRequest(f"no built corpus at {root} (run `rollstack bench corpus build --small`)")
    manifest, tasks = load_corpus(root)
    if not tasks:
        raise InvalidRequest(f"the corpus at {root} has no tasks")
    return LoadedCorpus(root=root, manifest=manifest.model_dump(), tasks=tasks,
                      seconds=time.monotonic() - t0)
