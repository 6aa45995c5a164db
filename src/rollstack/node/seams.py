"""The node's view of the stages it strings together: what `Stages` calls, typed.

The lazy store and the layer materializer are described by protocols (the node calls a daemon
client it started or one it adopted, and tests hand in fakes); the other stages are their
concrete classes (`Resolver`, `EnvironmentRuntime`, `Provisioner`), imported only for typing so
that importing the node stays cheap.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from rollstack.plan.resolve import LayerRef


class LazyStore(Protocol):
    """The FUSE lazy store daemon, through its control client (`rollstack.mount.client`)."""

    process: subprocess.Popen | None
    """Our child daemon; None for a daemon adopted from a previous agent."""

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
    def stop(self) -> None: ...


class Materializer(Protocol):
    """Local copies of hot layers (`rollstack.node.materialize.LayerMaterializer`)."""

    lazy: LazyStore

    def lower_for(self, digest: str) -> Path | None: ...
    def used(self, refs: Iterable[LayerRef]) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def stop(self) -> None: ...
