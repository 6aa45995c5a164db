"""rollstack's one error tree.

Every error a user, a plan, a registry or an environment can cause is a `RollstackError` with a
stable `code` (the string the CLI prints, the HTTP API returns and the SDK maps back to a class)
and an HTTP `status`. Lower-level errors are translated once, at the boundary that sees them:
OSError -> errno in FUSE ops, httpx -> `RegistryError` in the registry client, `RollstackError` ->
HTTP status + JSON in the node agent, -> one `error: <code>: <message>` line in the CLI.
`retryable` (also on the wire: `{"code", "message", "retryable"}`) says whether the same call
may succeed later or elsewhere; the ones marked (R) below are, every other code is not.

    RollstackError
    ├── InvalidRequest            invalid_request       400
    │   ├── PlanInvalid           plan_invalid          422
    │   ├── IdempotencyConflict   idempotency_conflict  409   (a create's key reused for another request)
    │   ├── UnsafePath            unsafe_path           400
    │   ├── SourceInvalid         source_invalid        400   (bad tarball / directory to convert)
    │   └── AlreadyExists         already_exists        409   (creating what is there already)
    ├── NotFound                  not_found             404
    │   ├── GroupNotFound         group_not_found       404
    │   ├── BlobNotFound          blob_not_found        404
    │   ├── ManifestNotFound      manifest_not_found    404
    │   ├── EnvironmentNotFound   environment_not_found 404
    │   ├── TemplateNotFound      template_not_found    404   (an E2B templateID / published plan)
    │   ├── SandboxNotFound       sandbox_not_found     404   (an E2B sandbox id)
    │   └── VolumeNotFound        volume_not_found      404   (a volume name or id)
    ├── FormatError               format_error          422   (a blob that is not a valid layer)
    │   └── IntegrityError        integrity_error       502   (bytes do not match their digest)
    ├── RegistryError             registry_error        502
    │   ├── RegistryUnavailable   registry_unavailable  503   (R: the registry is away)
    │   └── RegistryAuthError     registry_auth         502
    ├── Unauthorized              unauthorized          401
    ├── InsufficientCapacity      insufficient_capacity 503   (R: capacity frees as envs end)
    │   └── DiskFull              disk_full             507   (R: the node's disk is full; frees as envs end)
    ├── MutationFailed            mutation_failed       422
    ├── ExecTimeout               exec_timeout          504
    ├── CommandFailed             command_failed        422   (check=True and a non-zero exit)
    ├── OomTerminated             oom_terminated        409
    ├── EnvironmentGone           environment_gone      409
    ├── EnvironmentPaused         environment_paused    409   (resume it first)
    ├── VolumeBusy                volume_busy           409   (mounted read-write elsewhere / still mounted)
    ├── RuntimeFailure            runtime_error         500
    ├── PortUnavailable           port_unavailable      502   (an exposed port nobody listens on)
    ├── NodeUnavailable           node_unavailable      503   (R: the node is restarting)
    │   ├── NodeLost              node_lost             503   (R: the env's node died; resample)
    │   └── ClusterUnavailable    cluster_unavailable   503   (R: no Ray cluster / no rollstack node)
    ├── RootInUse                 root_in_use           409   (a live agent holds the node root)
    └── InternalError             internal_error        500
"""

from __future__ import annotations

import errno
from typing import Any


class RollstackError(Exception):
    """Base of every rollstack error. `code` is stable; `message` is for people."""

    code = "rollstack_error"
    status = 500
    retryable = False
    """True when the same call may succeed if retried elsewhere or later (e.g. `node_lost`)."""

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.details:
            body["details"] = self.details
        return body

    def __str__(self) -> str:
        return self.message or self.code


class InvalidRequest(RollstackError, ValueError):
    code, status = "invalid_request", 400


class PlanInvalid(InvalidRequest):
    code, status = "plan_invalid", 422


class UnsafePath(InvalidRequest):
    code, status = "unsafe_path", 400


class SourceInvalid(InvalidRequest):
    code, status = "source_invalid", 400


class IdempotencyConflict(InvalidRequest):
    """An `Idempotency-Key` already used for a different create (another plan, count or lease)
    within the key's lifetime. Not retryable: the same request gets the same answer; use a new key."""

    code, status = "idempotency_conflict", 409


class NotFound(RollstackError, LookupError):
    code, status = "not_found", 404


class GroupNotFound(NotFound):
    code = "group_not_found"


class BlobNotFound(NotFound):
    code = "blob_not_found"


class ManifestNotFound(NotFound):
    code = "manifest_not_found"


class EnvironmentNotFound(NotFound):
    code = "environment_not_found"


class TemplateNotFound(NotFound):
    """A published plan (`NAME:TAG`, an E2B templateID) that is not in the store."""

    code = "template_not_found"


class SandboxNotFound(NotFound):
    """No E2B sandbox with that id on this node (never created here, killed, expired)."""

    code = "sandbox_not_found"


class VolumeNotFound(NotFound):
    code = "volume_not_found"


class AlreadyExists(InvalidRequest):
    """Creating what is there already (a directory in an environment)."""

    code, status = "already_exists", 409


class FormatError(RollstackError, ValueError):
    code, status = "format_error", 422


class IntegrityError(FormatError):
    code, status = "integrity_error", 502


class RegistryError(RollstackError):
    code, status = "registry_error", 502


class RegistryUnavailable(RegistryError, ConnectionError):
    code, status = "registry_unavailable", 503
    retryable = True


class RegistryAuthError(RegistryError, PermissionError):
    code, status = "registry_auth", 502


class Unauthorized(RollstackError, PermissionError):
    code, status = "unauthorized", 401


class InsufficientCapacity(RollstackError):
    code, status = "insufficient_capacity", 503
    retryable = True


class DiskFull(InsufficientCapacity):
    """A write the node made for the caller met a full disk (ENOSPC/EDQUOT). Retryable: space
    frees as environments end, or another node has it."""

    code, status = "disk_full", 507


def is_disk_full(exc: BaseException) -> bool:
    """An OSError saying the disk (or the quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class MutationFailed(RollstackError):
    code, status = "mutation_failed", 422


class ExecTimeout(RollstackError, TimeoutError):
    code, status = "exec_timeout", 504


class CommandFailed(RollstackError, RuntimeError):
    """A command run with `check=True` (adapters, e.g. slime's protocol) exited non-zero."""

    code, status = "command_failed", 422


class OomTerminated(RollstackError):
    code, status = "oom_terminated", 409


class EnvironmentGone(RollstackError):
    code, status = "environment_gone", 409


class EnvironmentPaused(RollstackError):
    code, status = "environment_paused", 409


class VolumeBusy(RollstackError):
    """A volume another environment mounts read-write (one writer at a time), or one still
    mounted when it is deleted. Not retryable as is: destroy those environments first."""

    code, status = "volume_busy", 409


class RuntimeFailure(RollstackError, OSError):
    code, status = "runtime_error", 500


class PortUnavailable(RollstackError):
    code, status = "port_unavailable", 502


class NodeUnavailable(RollstackError, ConnectionError):
    code, status = "node_unavailable", 503
    retryable = True


class NodeLost(NodeUnavailable):
    """The environment's node died or restarted: the environment is gone; resample elsewhere."""

    code, status = "node_lost", 503
    retryable = True


class ClusterUnavailable(NodeUnavailable):
    code, status = "cluster_unavailable", 503


class RootInUse(RollstackError):
    code, status = "root_in_use", 409


class InternalError(RollstackError):
    code, status = "internal_error", 500


def _all_classes() -> list[type[RollstackError]]:
    seen: list[type[RollstackError]] = []
    stack: list[type[RollstackError]] = [RollstackError]
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen


def error_class(code: str) -> type[RollstackError]:
    """The class for a wire `code` (unknown codes map to `RollstackError`)."""
    for cls in _all_classes():
        if cls.code == code:
            return cls
    return RollstackError


def from_dict(body: dict[str, Any]) -> RollstackError:
    """Rebuild a typed error from the `{"code", "message"}` the API returns."""
    cls = error_class(str(body.get("code", "")))
    err = cls(str(body.get("message", "")), **(body.get("details") or {}))
    if cls is RollstackError:
        err.code = str(body.get("code", "rollstack_error"))
        err.retryable = bool(body.get("retryable", False))  # a newer node's code we do not know
    return err
