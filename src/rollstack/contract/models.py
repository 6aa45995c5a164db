"""The node agent's wire contract: every request and response body, in one file.

The HTTP API (`rollstack.node.api`), the in-process `Node` and the SDK (`rollstack.client`) all
speak these pydantic models, so a field means the same thing on both sides of the wire. Shapes
follow interface.md (`env create --json`, exec, evaluate, stats, the error body).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

class _Wire(BaseModel):
    # Unknown fields from a newer peer are kept, not rejected: the contract may only grow.
    model_config = ConfigDict(extra="allow")


MAX_LEASE = 86400.0
"""Longest lease a create or renewal may ask for (seconds)."""
Number = Annotated[float, Strict()]
"""A JSON number in a request (`true` is not 1 second: lax pydantic would take a bool for 1.0)."""
Count = Annotated[int, Strict()]
IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The create request header naming a retry-safe create (docs/node.md, "Idempotent creates")."""


class CreateRequest(BaseModel):
    """`POST /v1/environments`: the plan (the YAML plan as JSON; a mutation may be inline), or a
    published plan's `NAME:TAG` (resolved from the node's store). An `Idempotency-Key` header
    makes a retry of the same request return the same environment(s)."""

    model_config = ConfigDict(extra="forbid")
    plan: dict[str, Any] | str
    count: Count | None = Field(default=None, ge=1, le=256)
    """N identical environments of the plan in one call (a GRPO group), all or none; the answer
    is then a `CreateGroupResponse`. Absent: one environment, a `CreateResponse`."""
    lease: Number | None = Field(default=None, gt=0, le=MAX_LEASE)
    """Seconds: the client promises to renew the environment's lease (`POST /v1/leases`) within
    this; the node reaps it once a lease lapses (`lease_expired`), on top of its lifetime.
    Absent: no lease, the environment lives its lifetime (plan `timeout`)."""


class NetworkRequest(BaseModel):
    """`PUT /v1/environments/{id}/network`: its egress policy from now on, as a plan's `network`
    (`none`, `outbound`, `{allow: [...]}`); the environment must have been created with a network."""

    model_config = ConfigDict(extra="forbid")
    network: Any


PAUSE_MODES = ("freeze", "checkpoint")


class PauseRequest(BaseModel):
    """`POST /v1/environments/{id}/pause`: `freeze` (default: its processes frozen in memory by
    the cgroup freezer) or `checkpoint` (dumped to disk by CRIU and ended: no memory held;
    `resume` restores the same processes; runc only). docs/fork.md."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["freeze", "checkpoint"] = "freeze"


class ForkRequest(BaseModel):
    """`POST /v1/environments/{id}/fork`: `count` new environments whose filesystem is the
    parent's at this instant (the parent runs on unchanged); processes are not carried over.
    The answer is a `CreateGroupResponse`."""

    model_config = ConfigDict(extra="forbid")
    count: Count = Field(default=1, ge=1, le=256)
    lease: Number | None = Field(default=None, gt=0, le=MAX_LEASE)
    """Seconds within which the client renews the children's leases, else the node reaps them."""


class SnapshotRequest(BaseModel):
    """`POST /v1/environments/{id}/snapshot`: publish the environment's filesystem as `name`
    (`NAME:TAG`), a plan any node sharing the store starts from (docs/fork.md)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=3, max_length=256)


class VolumeRequest(BaseModel):
    """`POST /v1/volumes`: a new, empty volume (docs/node.md#volumes)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=63)


class VolumeInfo(_Wire):
    """A node volume (`GET /v1/volumes`)."""

    name: str
    created: float
    """Unix time of its create."""
    mounted_by: list[str] = Field(default_factory=list)
    """The environments mounting it now."""


class SnapshotInfo(_Wire):
    """A snapshot in the node's store (`GET /v1/snapshots`)."""

    plan: str
    """`NAME:TAG`: what `create` starts from."""
    group: str
    source: str
    """The id of the environment it was taken of ("" if unknown)."""
    created: str
    bytes: int
    layer: str


class Snapshot(_Wire):
    """A published snapshot: `plan` (`NAME:TAG`) starts from it; its changes are the layer
    group `group` stacked on the parent's groups."""

    plan: str
    group: str
    layer: str
    """The layer's digest."""
    files: int
    bytes: int
    seconds: float
    trace_chunks: int = 0
    """Chunks of the environment's reads published as the snapshot's access trace (a node
    starting from it prefetches them); 0 when it read nothing through the lazy store."""


class LeaseRequest(BaseModel):
    """`POST /v1/environments/{id}/lease`: renew one environment's lease."""

    model_config = ConfigDict(extra="forbid")
    lease: Number | None = Field(default=None, gt=0, le=MAX_LEASE)
    """Seconds from now; absent: the environment's own lease (an environment without a lease
    gets one only when this is given)."""


class RenewRequest(BaseModel):
    """`POST /v1/leases`: renew the leases of many environments in one request (an RL client's
    whole batch)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[str] = Field(max_length=100_000)
    lease: Number | None = Field(default=None, gt=0, le=MAX_LEASE)
    """As in `LeaseRequest`, for every id."""


class LeaseRenewal(_Wire):
    """The answer to a renewal: which ids were renewed, which are not (or no longer) live here
    (never created, destroyed, reaped: the client stops renewing those)."""

    renewed: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)


class Timings(_Wire):
    """Seconds spent in each create phase."""

    resolve: float = 0.0
    toc: float = 0.0
    mount: float = 0.0
    mutation: float = 0.0
    start: float = 0.0
    total: float = 0.0
    setup: float = 0.0
    """The plan's setup commands (a group's: run once, in the environment it was forked from)."""
    warm: bool = False
    """A warm sandbox was handed out (rollstack.node.warm): mount and start happened before."""
    group: dict[str, float] | None = None
    """In a `count` create only: the phases done once for the whole group, each in seconds as it
    happened once (`count`, `resolve`, `toc`: layers' TOCs, `begin`: one lazy store request for
    all, `warm_take`, `mutation_plan`, `total`). The fields above are this environment's own view:
    `resolve` and `toc` are the group's (it waited for them), `mutation` its own write plus the
    group's plan (computed by the first environment, waited for by the others; node/fanout.py)."""


class FetchStats(_Wire):
    """Bytes of the layer stack, and where the bytes read before the environment was ready came from."""

    stack_bytes: int = 0
    fetched_bytes: int = 0
    """Bytes pulled from the registry for this environment before it was ready."""
    from_cache_bytes: int = 0
    from_peer_bytes: int = 0


class NetworkInfo(_Wire):
    """An environment's network (absent for `network: none` without `expose`)."""

    mode: str
    address: str
    """The environment's address (the node reaches exposed ports there)."""
    gateway: str
    """The node, as seen from the environment."""
    token: str
    """Per-environment token, also in the environment as ROLLSTACK_ENV_TOKEN."""
    endpoints: list[str] = Field(default_factory=list)
    expose: list[int] = Field(default_factory=list)


class CreateResponse(_Wire):
    """The `env create --json` document."""

    id: str
    timings: Timings = Field(default_factory=Timings)
    fetch: FetchStats = Field(default_factory=FetchStats)
    stack_digest: str | None = None
    layers: int = 0
    network: NetworkInfo | None = None


class CreateGroupResponse(_Wire):
    """`POST /v1/environments` with `count`: one create document per environment."""

    environments: list[CreateResponse]


class ExecRequest(BaseModel):
    """`POST .../exec`: exactly one of `argv` (run as is) or `command` (run by /bin/sh -c)."""

    model_config = ConfigDict(extra="forbid")
    argv: list[str] | None = None
    command: str | None = None
    cwd: str | None = None
    """Working directory inside the environment (default: the plan's workdir)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables, on top of the plan's."""
    timeout: Number | None = Field(default=None, gt=0)
    """Seconds; on expiry the whole process tree is killed and `timed_out` is reported. None: no
    limit of its own (the environment's lifetime still ends it)."""
    stdin: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> "ExecRequest":
        if (self.argv is None) == (self.command is None):
            raise ValueError("give exactly one of 'argv' or 'command'")
        if self.argv is not None and not self.argv:
            raise ValueError("'argv' must not be empty")
        return self

    def resolved_argv(self) -> list[str]:
        """The argv to execute: `argv` as is, or `command` through the shell."""
        if self.argv is not None:
            return list(self.argv)
        return ["/bin/sh", "-c", self.command or ""]


class ExecResult(_Wire):
    """The outcome of one command."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    """True when output went past the cap and was cut."""


class ExecChunk(_Wire):
    """One line of the `exec/stream` NDJSON answer: output, then one final `result` (or `error`)."""

    type: Literal["stdout", "stderr", "result", "error"]
    data: str | None = None
    result: ExecResult | None = None
    error: dict[str, Any] | None = None


class Quotas(_Wire):
    """An environment's current limits (cores, bytes)."""

    cpu_limit: float | None = None
    memory_limit: int | None = None


class EnvironmentInfo(_Wire):
    """`GET /v1/environments[/{id}]`."""

    id: str
    state: str
    """creating | running | destroying | destroyed | oom_terminated | failed. `destroying` stays
    until every resource is reclaimed (a failed teardown is retried, `destroy_failed` events)."""
    plan_name: str | None = None
    age: float = 0.0
    timeout: float | None = None
    lease: float | None = None
    """The lease in seconds (None: no lease, only the lifetime)."""
    lease_remaining: float | None = None
    """Seconds until the lease lapses unless renewed."""
    quotas: Quotas = Field(default_factory=Quotas)
    pause_mode: str | None = None
    """While paused: `freeze` (its processes frozen in memory) or `checkpoint` (dumped to disk
    by CRIU and ended; `resume` restores them). None otherwise."""


class EnvironmentList(_Wire):
    environments: list[EnvironmentInfo] = Field(default_factory=list)


class Evaluation(_Wire):
    """`POST .../evaluate`: reward of the rollout, scored in a fresh clean environment."""

    reward: float
    exit_code: int
    output: str = ""
    timings: dict[str, float] = Field(default_factory=dict)
    timed_out: bool = False


class Sample(_Wire):
    """One provisioner sample (t in seconds since the environment started)."""

    t: float
    cpu_limit: float | None = None
    memory_limit: int | None = None
    cpu_usage: float | None = None
    memory_usage: int | None = None


class Stats(_Wire):
    """`GET .../stats`: usage and quota history, and provisioning events."""

    history: list[Sample] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    state: str | None = None


class ErrorDetail(_Wire):
    code: str
    message: str = ""


class ErrorBody(_Wire):
    """Every error answer: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


class Health(_Wire):
    status: str = "ok"
    environments: int = 0
    version: str | None = None


class NodeInfo(_Wire):
    """`GET /v1/node`: what a pool places by (capacity left, hot layers, live envs per task)."""

    instance: str
    """Changes every time the agent starts: an environment id is only valid within one instance."""
    environments: int = 0
    env_ids: list[str] = Field(default_factory=list)
    capacity: dict[str, float] = Field(default_factory=dict)
    """cpu (cores), memory (bytes), slots (environments)."""
    free: dict[str, float] = Field(default_factory=dict)
    """Still admissible: cpu, memory, slots."""
    hot_layers: list[str] = Field(default_factory=list)
    """Layer digests loaded in the lazy store or materialized on this node."""
    groups: dict[str, int] = Field(default_factory=dict)
    """Trace key (task) -> live environments of it here."""
    status: str = "ok"
