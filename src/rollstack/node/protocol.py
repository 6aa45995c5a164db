"""The interface every environment backend implements: `NodeService` (the real one), the fakes
in tests. The HTTP API wraps one, the in-process `Node` wraps one, and the SDK's `Client`
implements the same calls over HTTP, so an `Environment` handle works the same on all three.

All methods are blocking; callers on an event loop run them in a worker thread. A service may
also have `async exec_async(env_id, request, offload)` (the real one does): the HTTP API then
awaits it on its loop, and the service hands any blocking part to `await offload(fn)`.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from rollstack.node.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    LeaseRenewal,
    Stats,
)


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

    def list(self) -> list[EnvironmentInfo]: ...

    def info(self, env_id: str) -> EnvironmentInfo: ...

    def exec(self, env_id: str, request: ExecRequest) -> ExecResult: ...

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
