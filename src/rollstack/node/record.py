"""`EnvRecord`: what the node service knows about one environment, and its life states.

States: creating -> running -> destroying -> destroyed; running -> oom_terminated (the
provisioner ended it for lack of memory; its pieces are still reclaimed by destroy); creating ->
failed (the create raised; everything it built was torn down). A teardown that fails leaves the
record in destroying (listed, its recovery record kept) until a retry reclaims everything.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollstack.contract.models import CreateResponse, EnvironmentInfo, Quotas

if TYPE_CHECKING:
    from rollstack.plan.model import Plan
    from rollstack.plan.resolve import LayerRef
    from rollstack.run.environment import Environment

CREATING, RUNNING, DESTROYING, DESTROYED = "creating", "running", "destroying", "destroyed"
OOM_TERMINATED, FAILED = "oom_terminated", "failed"
PAUSED = "paused"
"""What `info` says of a running environment whose processes are frozen (`EnvRecord.paused`)."""
LIVE_STATES = (CREATING, RUNNING, OOM_TERMINATED)
"""States that hold node resources (count against admission)."""


def _done() -> threading.Event:
    e = threading.Event()
    e.set()
    return e


@dataclass
class EnvRecord:
    id: str
    plan: Plan
    """The validated `rollstack.plan.model.Plan`."""
    timeout: float
    internal: bool = False
    """An evaluator environment the node created for itself (not listed)."""
    paused: bool = False
    """Its processes are frozen and its quotas given back to admission (`NodeService.pause`)."""
    checkpointed: bool = False
    """Paused by a CRIU checkpoint (`pause(mode="checkpoint")`): its processes are dumped to disk
    and ended, not frozen in memory (rollstack.run.checkpoint)."""
    checkpointing: bool = False
    """A checkpoint is being taken now (under `lock`): an exec that fails meanwhile waits for it."""
    on_timeout: str = "destroy"
    """What the reaper does at the end of its lifetime: `destroy`, or `pause` (it then stays
    paused `NodeConfig.paused_ttl` more, until resumed with a new timeout, or destroyed)."""
    timeout_paused: bool = False
    """The reaper paused it at its timeout: the next end of its lifetime destroys it."""
    pause_failures: int = 0
    state: str = CREATING
    started_at: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held by destroy and by anything that must not race it (files, diff); never by exec."""
    runtime: Environment | None = None
    """The running environment (rollstack.run side)."""
    refs: list[LayerRef] = field(default_factory=list)
    net_spec: Any = None
    """The resolved network policy in force (`rollstack.run.network.NetworkSpec`; None after an
    agent restart until `set_network` resolves it again)."""
    fork_layers: list[Path] = field(default_factory=list)
    """The frozen uppers this environment stacks if it was forked (rollstack.node.forks)."""
    created: CreateResponse | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    oom_file: Path | None = None
    """The cgroup file counting kernel OOM kills (found on first use)."""
    execs: int = 0
    """Execs in flight (an OOM kill marks them failed); changed under the service's lock."""
    lease: float | None = None
    """Seconds the client promised to renew within; None: no lease (only the lifetime)."""
    lease_until: float | None = None
    """time.monotonic() at which the lease lapses (set once running, moved by each renewal)."""
    final: str | None = None
    """The state a started teardown ends in (destroyed, failed); kept across its retries."""
    terminated: bool = False
    """The environment was OOM-terminated before its teardown began (its final state says so)."""
    teardown_failures: int = 0
    """Failed teardown attempts so far; the reaper retries at `teardown_retry_at`."""
    teardown_retry_at: float = 0.0
    built: threading.Event = field(default_factory=_done)
    """Clear while a create builds the environment (`NodeService._admit` to the end of
    `_create`): a destroy from elsewhere waits for it instead of tearing mounts down under it."""

    @property
    def deadline(self) -> float:
        return self.started_mono + self.timeout

    def age(self) -> float:
        return time.monotonic() - self.started_mono

    def renew(self, lease: float | None = None) -> None:
        """Move the lease's end to now + `lease` (default: its own); no lease, no change."""
        if lease is not None:
            self.lease = float(lease)
        if self.lease is not None:
            self.lease_until = time.monotonic() + self.lease

    def lapsed(self, now: float) -> bool:
        return self.lease_until is not None and self.lease_until <= now

    def recovery_doc(self) -> dict[str, Any]:
        """What `node-envs/<id>.json` keeps for re-adoption after a crash (node.recovery)."""
        doc: dict[str, Any] = {"plan": self.plan.model_dump(mode="json", exclude_none=True),
                               "timeout": self.timeout, "started_at": self.started_at}
        if self.lease is not None:
            doc["lease"] = self.lease
        if self.state == DESTROYING:
            doc["destroying"] = True  # a restart finishes the destroy instead of adopting
        if self.paused:
            doc["paused"] = True  # frozen in the kernel: adopted as paused
        if self.checkpointed:
            doc["checkpointed"] = True  # dumped to disk: adopted without a container
        if self.on_timeout != "destroy":
            doc["on_timeout"] = self.on_timeout
        if self.timeout_paused:
            doc["timeout_paused"] = True
        return doc

    def event(self, kind: str, **data: Any) -> None:
        self.events.append({"t": round(time.time(), 3), "type": kind, **data})

    def info(self, quotas: Quotas | None = None) -> EnvironmentInfo:
        if quotas is None:
            quotas = Quotas(cpu_limit=self.plan.resources.cpu, memory_limit=self.plan.resources.memory)
        return EnvironmentInfo(
            id=self.id,
            state=PAUSED if self.paused and self.state == RUNNING else self.state,
            plan_name=self.plan.name,
            age=round(self.age(), 3),
            timeout=self.timeout,
            quotas=quotas,
            lease=self.lease,
            lease_remaining=None if self.lease_until is None
            else round(max(0.0, self.lease_until - time.monotonic()), 3),
            pause_mode=("checkpoint" if self.checkpointed else "freeze") if self.paused else None,
        )
