"""The service every environment backend implements, and what the API, the SDK and the E2B
adapter call: `EnvironmentService` (blocking) and `AsyncEnvironmentService` (its awaitable twin).

`NodeService` is the real one; the HTTP API wraps one, the in-process `Node` wraps one, and the
SDK's `HttpService` / `AsyncHttpService` implement the same calls over HTTP, so an `Environment`
handle works the same on all three. Blocking methods are called from worker threads by callers
on an event loop; `exec_async` is the one awaited on the loop itself (it hands any blocking part
to `await offload(fn)`). `OffloadedExec` gives it to a service whose exec only blocks.

`NodeLocal` is the part only an in-process caller can use (the E2B adapter runs in the node's
process): execs attached to a caller-held control, the lifetime, the merged root for directory
operations.
"""

from __future__ import annotations

from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Protocol, TypeVar

from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    LeaseRenewal,
    Snapshot,
    SnapshotInfo,
    Stats,
    VolumeInfo,
)

T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]
"""Runs a blocking call in a worker thread and awaits it (the API's `offload`)."""


class EnvironmentService(Protocol):
    def create(self, plan: dict[str, Any], lease: float | None = None,
               idempotency_key: str | None = None) -> CreateResponse:
        """`lease`: seconds within which the client renews it (`renew`), else the node reaps it;
        None: only its lifetime. `idempotency_key`: a retry with the key returns the same
        environment. (A service may lack both: callers pass them only when set.)"""
        ...

    def create_many(self, plan: dict[str, Any], count: int, lease: float | None = None,
                    idempotency_key: str | None = None) -> list[CreateResponse]:
        """`count` environments of one plan, all or none (a GRPO group)."""
        ...

    def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal:
        """Renew leases (to `lease` seconds from now if given, else each environment's own)."""
        ...

    def fork(self, env_id: str, count: int = 1, lease: float | None = None,
             idempotency_key: str | None = None) -> list[CreateResponse]:
        """`count` new environments whose filesystem is `env_id`'s now (docs/fork.md);
        `idempotency_key` as in `create` (a retry returns the same children)."""
        ...

    def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo:
        """Freeze its processes (`checkpoint`: dump them to disk with CRIU and end them), give its
        quotas back to admission (state `paused`). Idempotent for the same mode."""
        ...

    def resume(self, env_id: str) -> EnvironmentInfo:
        """Thaw it once admission takes its quotas back. Idempotent."""
        ...

    def snapshot(self, env_id: str, name: str) -> Snapshot:
        """Publish its filesystem now as plan `name` (NAME:TAG) that any node starts from."""
        ...

    def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        """The snapshots in the node's store (of environment `source` only, if given)."""
        ...

    def set_network(self, env_id: str, network: Any) -> EnvironmentInfo:
        """Replace its egress policy now (`network` as a plan takes it)."""
        ...

    def delete_snapshot(self, name: str) -> None:
        """Remove snapshot `name` (NAME:TAG) from the store; `template_not_found` if none."""
        ...

    def create_volume(self, name: str) -> VolumeInfo:
        """A new, empty volume `name` that plans mount (`volumes: [{name, path}]`)."""
        ...

    def volumes(self) -> list[VolumeInfo]:
        """The node's volumes and who mounts each."""
        ...

    def delete_volume(self, name: str) -> None:
        """Remove volume `name` and its files; `volume_busy` while an environment mounts it."""
        ...

    def read_volume_file(self, name: str, path: str) -> bytes:
        """A file in volume `name` (paths are the volume's own: `/` is its top)."""
        ...

    def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        """Write a file into volume `name` (missing parent directories are made)."""
        ...

    def list(self) -> list[EnvironmentInfo]: ...

    def info(self, env_id: str) -> EnvironmentInfo: ...

    def exec(self, env_id: str, request: ExecRequest) -> ExecResult: ...

    async def exec_async(self, env_id: str, request: ExecRequest, offload: Offload[Any]) -> ExecResult:
        """`exec` on the caller's event loop; blocking parts go through `offload`."""
        ...

    def exec_stream(self, env_id: str, request: ExecRequest) -> Iterator[ExecChunk]:
        """Output chunks as they come, then exactly one `result` chunk."""
        ...

    def read_file(self, env_id: str, path: str) -> bytes: ...

    def write_file(self, env_id: str, path: str, data: bytes) -> None: ...

    def diff(self, env_id: str, binary: str = "name") -> str:
        """Unified diff from the root; binary files named ("name") or as git binary patches ("patch")."""
        ...

    def evaluate(self, env_id: str) -> Evaluation: ...

    def stats(self, env_id: str) -> Stats: ...

    def destroy(self, env_id: str) -> None:
        """Idempotent: destroying an unknown or already destroyed environment is not an error."""
        ...

    def health(self) -> Health: ...

    def port_target(self, env_id: str, port: int) -> str:
        """`http://ADDRESS:PORT` of a port the plan exposes (rollstack.node.ports)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Gauges for /metrics: name -> value (names without the `rollstack_` prefix)."""
        ...


class ProcessControl(Protocol):
    """A caller's handle on one attached exec in flight (rollstack.run.execpump.ExecControl)."""

    def write_stdin(self, data: bytes, timeout: float = 30.0) -> bool: ...
    def close_stdin(self) -> bool: ...
    def signal(self, sig: int, wait: float = 10.0) -> bool: ...
    def pid(self, wait: float = 2.0) -> int | None: ...
    def finish(self) -> None: ...


class NodeLocal(EnvironmentService, Protocol):
    """What only a caller in the node's own process can ask (the E2B adapter)."""

    max_file_bytes: int
    """Largest file the files API reads or writes in one request."""

    def exec_attached(self, env_id: str, request: ExecRequest, on_output: Callable[[str, bytes], None],
                      control: Any) -> ExecResult:
        """A blocking exec whose caller holds `control` (`rollstack.run.execpump.ExecControl`):
        stdin written while it runs, signals, its pid. For long-lived processes."""
        ...

    def set_timeout(self, env_id: str, seconds: float, on_timeout: str | None = None) -> EnvironmentInfo:
        """From now on the environment lives `seconds` more; then the reaper destroys it, or
        pauses it when `on_timeout` is `pause`."""
        ...

    def with_root(self, env_id: str, fn: Callable[[Any], T]) -> T:
        """`fn(root)` with the environment's merged root dir (a host path), not racing destroy."""
        ...

    def tree(self, env_id: str, op: str, *args: Any) -> Any:
        """A directory operation inside the environment, confined to its root (symlinks never
        lead out): `entry(path)`, `walk(path, depth)`, `make_dir(path)`, `move(src, dst)`,
        `remove(path)`; entries are `rollstack.contract.files.Entry`."""
        ...

    def volume_tree(self, name: str, op: str, *args: Any) -> Any:
        """`tree`'s operations (and `set_attrs(path, uid, gid, mode)`) inside volume `name`."""
        ...

    def has_path(self, env_id: str, path: str) -> bool:
        """Whether `path` exists in the environment (an absolute symlink counts: it is not followed)."""
        ...

    def exec_control(self, open_stdin: bool = False) -> ProcessControl:
        """A control for one `exec_attached` call."""
        ...


class AsyncEnvironmentService(Protocol):
    """`EnvironmentService` over an event loop (the SDK's `AsyncHttpService`): the same calls,
    awaited; `exec_stream` is an async iterator."""

    async def create(self, plan: dict[str, Any], lease: float | None = None,
                     idempotency_key: str | None = None) -> CreateResponse: ...
    async def create_many(self, plan: dict[str, Any], count: int, lease: float | None = None,
                          idempotency_key: str | None = None) -> list[CreateResponse]: ...
    async def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal: ...
    async def fork(self, env_id: str, count: int = 1, lease: float | None = None,
                   idempotency_key: str | None = None) -> list[CreateResponse]: ...
    async def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo: ...
    async def resume(self, env_id: str) -> EnvironmentInfo: ...
    async def snapshot(self, env_id: str, name: str) -> Snapshot: ...
    async def snapshots(self, source: str | None = None) -> list[SnapshotInfo]: ...
    async def set_network(self, env_id: str, network: Any) -> EnvironmentInfo: ...
    async def delete_snapshot(self, name: str) -> None: ...
    async def create_volume(self, name: str) -> VolumeInfo: ...
    async def volumes(self) -> list[VolumeInfo]: ...
    async def delete_volume(self, name: str) -> None: ...
    async def read_volume_file(self, name: str, path: str) -> bytes: ...
    async def write_volume_file(self, name: str, path: str, data: bytes) -> None: ...
    async def list(self) -> list[EnvironmentInfo]: ...
    async def info(self, env_id: str) -> EnvironmentInfo: ...
    async def exec(self, env_id: str, request: ExecRequest) -> ExecResult: ...
    def exec_stream(self, env_id: str, request: ExecRequest) -> AsyncIterator[ExecChunk]: ...
    async def read_file(self, env_id: str, path: str) -> bytes: ...
    async def write_file(self, env_id: str, path: str, data: bytes) -> None: ...
    async def diff(self, env_id: str, binary: str = "name") -> str: ...
    async def evaluate(self, env_id: str) -> Evaluation: ...
    async def stats(self, env_id: str) -> Stats: ...
    async def destroy(self, env_id: str) -> None: ...
    async def health(self) -> Health: ...
    async def metrics(self) -> dict[str, float]: ...


class OffloadedExec:
    """`exec_async` for a service whose `exec` only blocks: it runs in a worker thread."""

    exec: Callable[[str, ExecRequest], ExecResult]

    async def exec_async(self, env_id: str, request: ExecRequest, offload: Offload[Any]) -> ExecResult:
        result: ExecResult = await offload(partial(self.exec, env_id, request))
        return result
