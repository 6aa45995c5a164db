"""The synchronous `Environment` handle and the facade `Client` and the in-process `Node` share.

Both wrap an `EnvironmentService` (HTTP for `Client`, `NodeService` for `Node`); the handle only
knows the service and its id, so the two behave the same. A handle used as a context manager is
always destroyed on exit, whatever happened inside. A facade with a lease keeper
(`client.leases`) creates with its lease and renews what it created until it is destroyed.
"""

from __future__ import annotations

from typing import Any, Iterator, overload

from rollstack.client._base import exec_request, plan_to_wire
from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecResult,
    Stats,
)
from rollstack.contract.service import EnvironmentService


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

    def destroy(self) -> None:
        """Idempotent."""
        self._service.destroy(self.id)
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


class EnvironmentFacade:
    """`create/get/list` over a service; the base of `Client` and `Node`."""

    _service: EnvironmentService
    _leases: Any = None
    """A `client.leases.LeaseKeeper` when the facade creates with a lease."""

    @overload
    def create(self, plan: Any, *, idempotency_key: str | None = None) -> Environment: ...

    @overload
    def create(self, plan: Any, count: int, *, idempotency_key: str | None = None) -> list[Environment]: ...

    def create(self, plan: Any, count: int | None = None, *,
               idempotency_key: str | None = None) -> Environment | list[Environment]:
        """`plan`: a dict, a path to a plan YAML file, or a `Plan`. With `count`, that many
        environments of the plan in one call (a GRPO group, all or none), as a list.
        `idempotency_key`: retrying the create with the same key (after a lost answer) returns
        the same environment(s), never a second set."""
        options = create_options(self._leases, idempotency_key)
        if count is not None:
            group = self._service.create_many(plan_to_wire(plan), count, **options)
            envs = [Environment(self._service, c.id, c, self._leases) for c in group]
        else:
            created = self._service.create(plan_to_wire(plan), **options)
            envs = [Environment(self._service, created.id, created, self._leases)]
        if self._leases is not None:
            self._leases.hold(self._service, [e.id for e in envs])
        return envs if count is not None else envs[0]

    def get(self, env_id: str) -> Environment:
        self._service.info(env_id)  # raises EnvironmentNotFound
        return Environment(self._service, env_id)

    def list(self) -> list[EnvironmentInfo]:
        return self._service.list()

    def destroy(self, env_id: str) -> None:
        """Destroy an environment by id (idempotent for ids this node destroyed)."""
        self._service.destroy(env_id)
        if self._leases is not None:
            self._leases.release(env_id)

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
