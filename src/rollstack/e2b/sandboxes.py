"""E2B sandboxes of one node: each is a node environment created from a published plan.

The sandbox id is the environment id. What E2B has and rollstack's environments do not (the
template name, metadata, default env vars, the envd access token, the process table) lives in
this table, in memory: a node restart forgets it (re-adopted environments are then reachable
through `/v1` only). The node stays the authority on liveness: an environment the reaper ended
(its timeout) or `/v1` destroyed is dropped here the next time it is looked up.

Leases: none. An E2B sandbox lives its `timeout`, which E2B clients move with `set_timeout` (and
`connect`): that is E2B's keep-alive, so the E2B SDK's own semantics already bound an abandoned
sandbox's life, and a client lease on top would reap sandboxes the unmodified SDK never renews.

Idempotency: the E2B SDK's `idempotency_key` (its `Idempotency-Key` header) goes to the node's
idempotent create (keys prefixed `e2b:`, apart from `/v1`'s): a retry gets the same sandbox, with
the same envd access token.

All methods block (they call the service); the API runs them in worker threads.
"""

from __future__ import annotations

import hmac
import math
import secrets
import threading
from typing import Any
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from rollstack.e2b.models import CreatedSandbox, ListedSandbox, NewSandbox, SandboxDetail
from rollstack.e2b.processes import ProcessTable
from rollstack.errors import (
    EnvironmentGone,
    EnvironmentNotFound,
    EnvironmentPaused,
    InvalidRequest,
    OomTerminated,
    SandboxNotFound,
    TemplateNotFound,
)
from rollstack.contract.service import NodeLocal


@dataclass
class Sandbox:
    id: str
    template_id: str
    access_token: str
    started_at: datetime
    end_at: datetime
    cpu_count: int
    memory_mb: int
    processes: ProcessTable
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    has_bash: bool | None = None
    """Whether /bin/bash exists in the sandbox (probed on first use; see envd_process)."""
    paused: bool = False
    timeout: int = 0
    """Seconds of life it was last given (a sandbox paused at its timeout gets them again on resume)."""
    on_timeout: str = "destroy"
    auto_resume: bool = False
    volume_mounts: list[dict[str, str]] = field(default_factory=list)

    def token_ok(self, given: str | None, node_token: str | None) -> bool:
        if node_token is None:
            return True
        if not given:
            return False
        return any(hmac.compare_digest(given.encode(), t.encode()) for t in (self.access_token, node_token))

    def created(self) -> CreatedSandbox:
        return CreatedSandbox(template_id=self.template_id, sandbox_id=self.id,
                              envd_access_token=self.access_token)

    def listed(self) -> ListedSandbox:
        return ListedSandbox(template_id=self.template_id, sandbox_id=self.id, started_at=self.started_at,
                             end_at=self.end_at, cpu_count=self.cpu_count, memory_mb=self.memory_mb,
                             metadata=self.metadata, state="paused" if self.paused else "running",
                             volume_mounts=self.volume_mounts)

    def detail(self) -> SandboxDetail:
        return SandboxDetail(**self.listed().model_dump(), envd_access_token=self.access_token)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class SandboxTable:
    def __init__(self, service: NodeLocal) -> None:
        self.service = service
        self._boxes: dict[str, Sandbox] = {}
        self._lock = threading.Lock()

    def create(self, req: NewSandbox, idempotency_key: str | None = None) -> Sandbox:
        """A new environment from the published plan `req.template_id`, living `req.timeout` s.
        With `idempotency_key`, a retry returns the sandbox the key created."""
        plan: Any = req.template_id
        changes: dict[str, Any] = {}
        if req.network_policy is not None:  # the template plan with the create's egress policy
            changes["network"] = req.network_policy
        if req.volume_mounts:  # ... and its volumes (E2B's mounts are shared, read-write)
            changes["volumes"] = [{"name": v.name, "path": v.path} for v in req.volume_mounts]
        if changes:
            plan = {"extends": req.template_id, **changes}
        if idempotency_key is None:
            created = self.service.create(plan)
        else:
            created = self.service.create(plan, idempotency_key=f"e2b:{idempotency_key}")
            known = self.peek(created.id)
            if known is not None:
                return known
        lifecycle = ("pause" if req.auto_pause else "destroy", bool(req.auto_resume and req.auto_resume.enabled))
        box = self._admit(created.id, req.template_id, req.timeout, req.metadata, req.env_vars, lifecycle)
        box.volume_mounts = [{"name": v.name, "path": v.path} for v in req.volume_mounts]
        return box

    def _admit(self, env_id: str, template_id: str, timeout: int, metadata: dict[str, str],
               env_vars: dict[str, str], lifecycle: tuple[str, bool] = ("destroy", False)) -> Sandbox:
        """A sandbox for the environment `env_id` just made: its lifetime (and what ends it:
        `lifecycle` = (on_timeout, auto_resume)) set, in the table."""
        try:
            info = self.service.set_timeout(env_id, float(timeout), on_timeout=lifecycle[0])
        except BaseException:
            self.service.destroy(env_id)
            raise
        quotas = info.quotas
        cpu = (quotas.cpu_limit if quotas else None) or 1
        memory = (quotas.memory_limit if quotas else None) or 0
        now = _now()
        box = Sandbox(
            id=env_id, template_id=template_id, access_token=secrets.token_urlsafe(24),
            started_at=now, end_at=now + timedelta(seconds=timeout),
            cpu_count=max(1, math.ceil(float(cpu))), memory_mb=int(memory) // (1024 * 1024),
            processes=ProcessTable(self.service, env_id, env_vars),
            metadata=dict(metadata), env_vars=dict(env_vars),
            timeout=int(timeout), on_timeout=lifecycle[0], auto_resume=lifecycle[1],
        )
        with self._lock:  # two concurrent retries of one key: the first box in wins
            return self._boxes.setdefault(box.id, box)

    def fork(self, sandbox_id: str, count: int, timeout: int) -> list[Sandbox]:
        """`count` sandboxes whose filesystem is `sandbox_id`'s now (rollstack's fork: the
        parent's processes are not carried over; docs/fork.md), each living `timeout` s."""
        parent = self.get(sandbox_id)
        made = self.service.fork(sandbox_id, count)
        boxes = []
        try:
            for c in made:
                boxes.append(self._admit(c.id, parent.template_id, timeout, parent.metadata, parent.env_vars,
                                         (parent.on_timeout, parent.auto_resume)))
                boxes[-1].volume_mounts = list(parent.volume_mounts)
        except BaseException:
            for c in made:
                self._forget(c.id)
                self.service.destroy(c.id)
            raise
        return boxes

    def snapshot(self, sandbox_id: str, name: str | None, memory: bool | None) -> dict[str, object]:
        """E2B's `create_snapshot(mode="filesystem")`: the node's snapshot of the sandbox under
        `NAME:TAG` (a fresh tag when `name` has none; `snapshots/<sandbox id>` without a name).
        The id is what `Sandbox.create(id)` takes (a published plan)."""
        if memory:
            raise InvalidRequest("memory: rollstack snapshots are filesystem-only (create_snapshot(mode='filesystem')); "
                                 "processes are not carried over")
        self.get(sandbox_id, paused_ok=True)
        base = name or f"snapshots/{sandbox_id}"
        ref = base if ":" in base.rsplit("/", 1)[-1] else f"{base}:s{secrets.token_hex(6)}"
        snap = self.service.snapshot(sandbox_id, ref)
        return {"snapshotID": snap.plan, "names": [snap.plan.rsplit(":", 1)[0]]}

    def snapshots(self, sandbox_id: str | None, name: str | None) -> list[dict[str, object]]:
        """`Sandbox.list_snapshots`: the node store's snapshots (of `sandbox_id`; named `name`,
        with or without its tag), as E2B's `{snapshotID, names}`."""
        out = []
        for s in self.service.snapshots(sandbox_id or None):
            base = s.plan.rsplit(":", 1)[0]
            if name and name not in (s.plan, base):
                continue
            out.append({"snapshotID": s.plan, "names": [base]})
        return out

    def delete_snapshot(self, snapshot_id: str) -> bool:
        """`Sandbox.delete_snapshot`: False when there is no such snapshot (E2B's 404)."""
        try:
            self.service.delete_snapshot(snapshot_id)
        except (TemplateNotFound, InvalidRequest):
            return False
        return True

    def update_network(self, sandbox_id: str, network: Any) -> None:
        """The sandbox's egress policy from now on (`network` as a plan takes it)."""
        self.get(sandbox_id, paused_ok=True)
        self.service.set_network(sandbox_id, network)

    def pause(self, sandbox_id: str) -> None:
        """Freeze the sandbox (its running processes too) and give its quotas back."""
        box = self.get(sandbox_id)
        self.service.pause(sandbox_id)
        box.paused = True

    def resume(self, sandbox_id: str) -> Sandbox:
        """Thaw a paused sandbox (a running one is left as it is). One the node paused at its
        timeout (`lifecycle` pause) lives its last timeout again from now."""
        box = self.get(sandbox_id, paused_ok=True)
        if box.paused:
            if box.end_at <= _now() + timedelta(seconds=1):  # its lifetime ran out (or is about to)
                self.service.set_timeout(sandbox_id, float(box.timeout))
                box.end_at = _now() + timedelta(seconds=box.timeout)
            self.service.resume(sandbox_id)
            box.paused = False
        return box

    def metrics(self, sandbox_id: str, start: int | None = None, end: int | None = None) -> list[dict]:
        """E2B's metrics entries from the provisioner's samples (CPU and memory, as used against
        the sandbox's current quotas; disk is not sampled: 0), between unix times `start`/`end`."""
        box = self.get(sandbox_id, paused_ok=True)
        stats = self.service.stats(sandbox_id)
        out = []
        for s in stats.history:
            at = box.started_at + timedelta(seconds=s.t)
            unix = int(at.timestamp())
            if (start is not None and unix < start) or (end is not None and unix > end):
                continue
            limit = s.cpu_limit or box.cpu_count
            out.append({"timestamp": at.isoformat().replace("+00:00", "Z"), "timestampUnix": unix,
                        "cpuCount": box.cpu_count,
                        "cpuUsedPct": round(100.0 * float(s.cpu_usage or 0.0) / float(limit), 2) if limit else 0.0,
                        "memUsed": int(s.memory_usage or 0), "memTotal": int(s.memory_limit or 0),
                        "memCache": 0, "diskUsed": 0, "diskTotal": 0})
        return out

    def peek(self, sandbox_id: str) -> Sandbox | None:
        with self._lock:
            return self._boxes.get(sandbox_id)

    def get(self, sandbox_id: str, paused_ok: bool = False) -> Sandbox:
        """The live sandbox `sandbox_id` (SandboxNotFound if it is not, or no longer, running;
        a paused one counts with `paused_ok`, else it is `environment_paused`)."""
        box = self.peek(sandbox_id)
        if box is None:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} was not found on this node")
        try:
            state = self.service.info(sandbox_id).state
        except (EnvironmentNotFound, EnvironmentGone, OomTerminated):
            state = "gone"
        box.paused = state == "paused"  # also when the node paused it at its timeout
        if state == "paused":
            if paused_ok:
                return box
            raise EnvironmentPaused(f"sandbox {sandbox_id!r} is paused: connect to it to resume it")
        if state != "running":
            self._forget(sandbox_id)
            raise SandboxNotFound(f"sandbox {sandbox_id!r} was not found on this node (it is {state})")
        return box

    def list(self, metadata: dict[str, str] | None = None, state_in: set[str] | None = None,
             started_after: datetime | None = None, template: str | None = None,
             newest_first: bool = False) -> list[Sandbox]:
        """The node's live sandboxes, oldest first (or newest), filtered as E2B's list filters:
        every `metadata` pair, a state in `state_in` (running, paused), started at or after
        `started_after`, from `template`."""
        states = {e.id: e.state for e in self.service.list() if e.state in ("running", "paused")}
        with self._lock:
            for gone in [i for i in self._boxes if i not in states]:
                self._boxes.pop(gone)
            boxes = sorted(self._boxes.values(), key=lambda b: b.started_at)
        for b in boxes:
            b.paused = states.get(b.id) == "paused"  # also when the node paused it at its timeout
        if metadata:
            boxes = [b for b in boxes if all(b.metadata.get(k) == v for k, v in metadata.items())]
        if state_in is not None:
            boxes = [b for b in boxes if ("paused" if b.paused else "running") in state_in]
        if started_after is not None:
            boxes = [b for b in boxes if b.started_at >= started_after]
        if template:
            boxes = [b for b in boxes if template in (b.template_id, b.template_id.rsplit(":", 1)[0])]
        return boxes[::-1] if newest_first else boxes

    def set_timeout(self, sandbox_id: str, seconds: int) -> Sandbox:
        box = self.get(sandbox_id)
        self.service.set_timeout(sandbox_id, float(seconds))
        box.end_at = _now() + timedelta(seconds=seconds)
        box.timeout = int(seconds)
        return box

    def refresh(self, sandbox_id: str, seconds: int) -> Sandbox:
        """E2B's keep-alive: the sandbox lives at least `seconds` more (a later end is kept)."""
        box = self.get(sandbox_id)
        if (box.end_at - _now()).total_seconds() < seconds:
            box = self.set_timeout(sandbox_id, seconds)
        return box

    def kill(self, sandbox_id: str) -> None:
        """Destroy the sandbox's environment (its processes end with it)."""
        box = self.get(sandbox_id, paused_ok=True)
        self._forget(sandbox_id)
        box.processes.kill_all()
        self.service.destroy(sandbox_id)

    def _forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._boxes.pop(sandbox_id, None)

    def close(self) -> None:
        with self._lock:
            self._boxes.clear()
