"""`LazyStore`: what the stages above call on the lazy store daemon, typed.

The node calls a daemon client it started or one it adopted from a previous agent
(`LazyStoreClient`); tests hand in fakes. `lowers/` reads layers through it too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from rollstack.plan.resolve import LayerRef


class LazyStore(Protocol):
    """The FUSE lazy store daemon, through its control client (`rollstack.lazystore.client`)."""

    process: subprocess.Popen | None
    """Our child daemon; None for a daemon adopted from a previous agent."""
    mountpoint: Path

    def add_layers(self, refs: Iterable[LayerRef]) -> dict[str, Any]: ...
    def layer_dir(self, digest: str) -> Path: ...
    def fetch_all(self, refs: Iterable[LayerRef], background: bool = False) -> dict[str, Any]: ...
    def begin_env(self, env_id: str, layer_refs: Iterable[LayerRef], trace_key: str | None = None,
                  background: bool = True, fallback_key: str | None = None) -> dict[str, Any]: ...
    def begin_envs(self, env_ids: Sequence[str], layer_refs: Iterable[LayerRef], trace_key: str | None = None,
                   background: bool = True, fallback_key: str | None = None) -> dict[str, Any]: ...
    def env_stats(self, env_id: str) -> dict[str, Any]: ...
    def end_env(self, env_id: str) -> dict[str, Any]: ...
    def stats(self) -> dict[str, Any]: ...
    def healthy(self) -> bool: ...
    def stop(self) -> None: ...
