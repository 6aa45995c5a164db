"""The environment handles, side by side: `Environment` (blocking) and `AsyncEnvironment`.

Each wraps a service (`EnvironmentService`: HTTP for `Client`, a `NodeService` for `Node`; or
`AsyncEnvironmentService`: HTTP for `AsyncClient`, a threaded `NodeService` for `AsyncNode`) and
an id, so a handle behaves the same whatever is behind it. A handle used as a context manager
is always destroyed on exit, whatever happened inside. A handle made by a facade with a lease
keeper (`client.leases`) is released from it on destroy.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator

from rollstack.client._base import exec_request
from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecResult,
    Snapshot,
    Stats,
)
from rollstack.contract.service import AsyncEnvironmentService, EnvironmentService


class Environment:
    """One environment on a node. `created` is the create document (timings, fetch) when known."""

    def __init__(self, service: EnvironmentService, env_id: str, created: CreateResponse | None = None,
                 leases: Any = None):
        self._service = service
        self.id = env_id
        self.created = created
        self._leases = leases
        """The keeper renewing this environment's lease (released on destroy), if any."""

    def __repr__(self) -> str:
        return f"Environment({self.id!r})"

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def exec(
        self,
        command: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
    ) -> ExecResult:
        """Run `command` (shell string or argv) to completion. A timeout is reported, not raised."""
        return self._service.exec(self.id, exec_request(command, timeout, cwd, env, stdin))

    def exec_stream(
        self,
        command: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
    ) -> Iterator[ExecChunk]:
        """Chunks of type `stdout`/`stderr` (`.data`) as they come, then one `result` (`.result`)."""
        return self._service.exec_stream(self.id, exec_request(command, timeout, cwd, env, stdin))

    def read_file(self, path: str) -> bytes:
        return self._service.read_file(self.id, path)

    def write_file(self, path: str, data: bytes | str) -> None:
        self._service.write_file(self.id, path, data.encode() if isinstance(data, str) else data)

    def diff(self, binary: str = "name") -> str:
        """Unified diff from the root: binary files named ("name") or as git binary patches ("patch")."""
        return self._service.diff(self.id, binary)

    def evaluate(self) -> Evaluation:
        return self._service.evaluate(self.id)

    def stats(self) -> Stats:
        return self._service.stats(self.id)

    def info(self) -> EnvironmentInfo:
        return self._service.info(self.id)

    def fork(self, count: int = 1, *, idempotency_key: str | None = None) -> list["Environment"]:
        """`count` new environments whose filesystem is this one's now; this one runs on
        unchanged. They inherit its plan (quotas, network policy, env, workdir), not its
        processes (docs/fork.md). `idempotency_key`: a retry with it (after a lost answer)
        returns the same children instead of making more."""
        lease = self._leases.lease if self._leases is not None else None
        made = self._service.fork(self.id, count, lease, **create_options(None, idempotency_key))
        children = [Environment(self._service, c.id, c, self._leases) for c in made]
        if self._leases is not None:
            self._leases.hold(self._service, [c.id for c in children])
        return children

    def set_network(self, network: Any) -> EnvironmentInfo:
        """Its egress policy from now on (`none`, `outbound`, `{allow: [...]}`, as in a plan); it
        must have been created with a network (any policy other than `none`, or `expose`)."""
        return self._service.set_network(self.id, network)

    def pause(self, mode: str = "freeze") -> EnvironmentInfo:
        """Freeze its processes and give its quotas back to the node (state `paused`); files
        stay readable and writable, execs answer `environment_paused` until `resume`.
        `mode="checkpoint"`: its processes are dumped to disk by CRIU and ended instead (no
        memory held), `resume` restores them; runc only, execs go through `runc exec` after."""
        return self._service.pause(self.id, mode)

    def resume(self) -> EnvironmentInfo:
        return self._service.resume(self.id)

    def snapshot(self, name: str) -> Snapshot:
        """Publish its filesystem now as plan `name` (`NAME:TAG`): `create(name)` starts from it
        on any node sharing the store (docs/fork.md)."""
        return self._service.snapshot(self.id, name)

    def destroy(self) -> None:
        """Idempotent."""
        self._service.destroy(self.id)
        if self._leases is not None:
            self._leases.release(self.id)


class AsyncEnvironment:
    """One environment, async. `async with` always destroys it on exit."""

    def __init__(self, service: AsyncEnvironmentService, env_id: str, created: CreateResponse | None = None,
                 leases: Any = None):
        self._service = service
        self.id = env_id
        self.created = created
        self._leases = leases

    def __repr__(self) -> str:
        return f"AsyncEnvironment({self.id!r})"

    async def __aenter__(self) -> "AsyncEnvironment":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    async def exec(self, command: str | list[str], timeout: float | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> ExecResult:
        """Run `command` (shell string or argv) to completion. A timeout is reported, not raised."""
        return await self._service.exec(self.id, exec_request(command, timeout, cwd, env, stdin))

    def exec_stream(self, command: str | list[str], timeout: float | None = None, cwd: str | None = None,
                    env: dict[str, str] | None = None, stdin: str | bytes | None = None) -> AsyncIterator[ExecChunk]:
        """Chunks of type `stdout`/`stderr` as they come, then one `result`."""
        return self._service.exec_stream(self.id, exec_request(command, timeout, cwd, env, stdin))

    async def read_file(self, path: str) -> bytes:
        return await self._service.read_file(self.id, path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._service.write_file(self.id, path, data.encode() if isinstance(data, str) else data)

    async def diff(self, binary: str = "name") -> str:
        return await self._service.diff(self.id, binary)

    async def evaluate(self) -> Evaluation:
        return await self._service.evaluate(self.id)

    async def stats(self) -> Stats:
        return await self._service.stats(self.id)

    async def info(self) -> EnvironmentInfo:
        return await self._service.info(self.id)

    async def fork(self, count: int = 1, *, idempotency_key: str | None = None) -> list["AsyncEnvironment"]:
        """`Environment.fork`, awaited."""
        lease = self._leases.lease if self._leases is not None else None
        made = await self._service.fork(self.id, count, lease, **create_options(None, idempotency_key))
        children = [AsyncEnvironment(self._service, c.id, c, self._leases) for c in made]
        if self._leases is not None:
            self._leases.hold(self._service, [c.id for c in children])
        return children

    async def set_network(self, network: Any) -> EnvironmentInfo:
        """`Environment.set_network`, awaited."""
        return await self._service.set_network(self.id, network)

    async def pause(self, mode: str = "freeze") -> EnvironmentInfo:
        """`Environment.pause`, awaited."""
        return await self._service.pause(self.id, mode)

    async def resume(self) -> EnvironmentInfo:
        return await self._service.resume(self.id)

    async def snapshot(self, name: str) -> Snapshot:
        """`Environment.snapshot`, awaited."""
        return await self._service.snapshot(self.id, name)

    async def destroy(self) -> None:
        """Idempotent."""
        await self._service.destroy(self.id)
        if self._leases is not None:
            self._leases.release(self.id)


def create_options(leases: Any, idempotency_key: str | None) -> dict[str, Any]:
    """The create call's optional arguments (only those set: a service may lack them)."""
    options: dict[str, Any] = {}
    if leases is not None:
        options["lease"] = leases.lease
    if idempotency_key is not None:
        options["idempotency_key"] = idempotency_key
    return options
