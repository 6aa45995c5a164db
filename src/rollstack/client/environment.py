"""The synchronous `Environment` handle and the facade `Client` and the in-process `Node` share.

Both wrap an `EnvironmentService` (HTTP for `Client`, `NodeService` for `Node`); the handle only
knows the service and its id, so the two behave the same. A handle used as a context manager is
always destroyed on exit, whatever happened inside.
"""

from __future__ import annotations

from typing import Any, Iterator, overload

from rollstack.client._base import exec_request, plan_to_wire
from rollstack.node.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecResult,
    Stats,
)
from rollstack.node.protocol import EnvironmentService


class Environment:
    """One environment on a node. `created` is the create document (timings, fetch) when known."""

    def __init__(self, service: EnvironmentService, env_id: str, created: CreateResponse | None = None):
        self._service = service
        self.id = env_id
        self.created = created

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

    def destroy(self) -> None:
        """Idempotent."""
        self._service.destroy(self.id)


class EnvironmentFacade:
    """`create/get/list` over a service; the base of `Client` and `Node`."""

    _service: EnvironmentService

    @overload
    def create(self, plan: Any) -> Environment: ...

    @overload
    def create(self, plan: Any, count: int) -> list[Environment]: ...

    def create(self, plan: Any, count: int | None = None) -> Environment | list[Environment]:
        """`plan`: a dict, a path to a plan YAML file, or a `Plan`. With `count`, that many
        environments of the plan in one call (a GRPO group, all or none), as a list."""
        if count is not None:
            group = self._service.create_many(plan_to_wire(plan), count)
            return [Environment(self._service, c.id, c) for c in group]
        created = self._service.create(plan_to_wire(plan))
        return Environment(self._service, created.id, created)

    def get(self, env_id: str) -> Environment:
        self._service.info(env_id)  # raises EnvironmentNotFound
        return Environment(self._service, env_id)

    def list(self) -> list[EnvironmentInfo]:
        return self._service.list()

    def destroy(self, env_id: str) -> None:
        """Destroy an environment by id (idempotent for ids this node destroyed)."""
        self._service.destroy(env_id)

    def health(self) -> Any:
        return self._service.health()

    def metrics(self) -> dict[str, float]:
        """The node's gauges (`<name>_total` counters, environments, lazy store...)."""
        return self._service.metrics()

    def close(self) -> None:
        pass

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
