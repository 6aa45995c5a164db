"""`Provisioner`: the node's 200 ms elastic-quota loop (a background thread, not asyncio).

Each tick samples every registered environment's cgroup, asks the pure `QuotaPolicy` what to do,
reclaims from idle environments when a grow would eat the admission reserve, and writes the new
quotas straight into the cgroup files (rollstack owns those cgroups). It keeps a bounded history
and an event log per environment and calls `on_terminate(env_id, reason)` when an OOM emergency
persists; the node agent then kills the environment and reports `oom_terminated`.

One lock guards all state; a tick holds it while it samples and writes (~40 us per environment),
so `register`/`admit` wait at most one tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from rollstack.core.stats import percentile
from rollstack.errors import (EnvironmentGone, EnvironmentNotFound, InsufficientCapacity, InvalidRequest,
                             RuntimeFailure)
from rollstack.provision.backend import CgroupBackend
from rollstack.provision.config import NodeCapacity, PolicyConfig
from rollstack.provision.policy import Decision, EnvState, QuotaPolicy, memory_floor

log = logging.getLogger(__name__)

TerminateCallback = Callable[[str, dict[str, Any]], None]


@dataclass
class _Env:
    env_id: str
    path: str
    state: EnvState
    history: deque = field(default_factory=deque)
    events: deque = field(default_factory=deque)
    status: str = "active"
    """active | terminated (emergency; waiting for the agent to unregister) | gone (cgroup vanished)."""


class Provisioner:
    """Elastic CPU/memory quotas for every registered environment on this node."""

    def __init__(
        self,
        backend: CgroupBackend,
        config: PolicyConfig | None = None,
        capacity: NodeCapacity | None = None,
        *,
        on_terminate: TerminateCallback | None = None,
        history_len: int = 600,
        events_len: int = 1000,
        registry: Any = None,
        held_memory: Callable[[], int] | None = None,
    ) -> None:
        self.backend = backend
        self.held_memory = held_memory
        """Bytes of node memory held outside every environment (the fork store's tmpfs in use),
        counted as committed: admissions and scale-ups leave it alone."""
        self.config = config or PolicyConfig()
        self.capacity = capacity or _host_capacity()
        self.policy = QuotaPolicy(self.config, self.capacity)
        self.on_terminate = on_terminate
        self._history_len = history_len
        self._events_len = events_len
        self._envs: dict[str, _Env] = {}
        self._pending: dict[str, EnvState] = {}  # admitted by `register`, quotas being written
        self._withdrawn: set[str] = set()  # pending ids unregistered meanwhile: never registered
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wall_offset = time.time() - time.monotonic()
        self._write_us: deque[tuple[str, float]] = deque(maxlen=4096)
        self._cost = {"ticks": 0, "samples": 0, "cpu_s": 0.0, "wall_s": 0.0}
        self.registry = registry
        if registry is not None:
            from rollstack.provision.metrics import ProvisionerCollector

            registry.register(ProvisionerCollector(self))

    # -- registration and admission ----------------------------------------------------------
    def admit(self, cpu: float, memory: int) -> bool:
        """Would an environment with these start quotas be admitted now (reserve may be used)?"""
        with self._lock:
            return self._node().admits(cpu, memory)

    def register(
        self,
        env_id: str,
        cgroup_path: str,
        start_cpu: float,
        start_memory: int,
        max_cpu: float | None = None,
        max_memory: int | None = None,
        *,
        check_admission: bool = True,
    ) -> dict[str, Any]:
        """Start managing `cgroup_path`: apply the start quotas (and v1 oom_kill_disable).

        Raises `InsufficientCapacity` if `check_admission` and the start quotas do not fit.
        Returns the applied quotas and caps.
        """
        if start_cpu <= 0 or start_memory <= 0:
            raise InvalidRequest("start quotas must be positive", cpu=start_cpu, memory=start_memory)
        with self._lock:  # admission and the reservation: atomic against concurrent registers
            if env_id in self._envs or env_id in self._pending:
                raise InvalidRequest(f"environment {env_id} is already registered", env=env_id)
            now = time.monotonic()
            state = self.policy.new_state(env_id, start_cpu, start_memory, max_cpu, max_memory, now)
            if check_admission and not self._node().admits(state.cpu, state.memory):
                raise InsufficientCapacity(
                    f"node cannot admit {state.cpu:g} cores / {state.memory} bytes",
                    **self.committed(),
                )
            self._pending[env_id] = state  # counted by _node() until it is registered or failed
        # The cgroup writes and the baseline sample (~0.8 ms) outside the lock: a GRPO group's
        # builders register in parallel instead of queueing behind each other's cgroup I/O (and
        # the 200 ms tick is not held up). Nothing else knows the cgroup yet.
        try:
            # Idempotent: the runtime may have created it already; also sets v1 oom_kill_disable.
            self.backend.create(cgroup_path)
            self._write(self.backend.set_cpu, cgroup_path, state.cpu, kind="cpu")
            applied = self._write(self.backend.set_memory_quota, cgroup_path, state.memory, state.max_memory,
                                  kind="memory_up")
            if applied > state.memory:  # usage already above the start value (v1 EBUSY)
                usage = self.backend.sample(cgroup_path).memory_usage
                target = min(state.max_memory, memory_floor(self.config, usage))
                applied = self._write(self.backend.set_memory_quota, cgroup_path, target, state.max_memory,
                                      kind="memory_up")
            try:  # baseline sample now, so the first tick can already decide (<= 200 ms to grow)
                baseline = self.backend.sample(cgroup_path)
            except OSError:
                baseline = None
        except BaseException as exc:
            with self._lock:
                self._pending.pop(env_id, None)
                self._withdrawn.discard(env_id)
            try:
                self.backend.forget(cgroup_path)
            except OSError:  # the register's own error is the one to report
                log.exception("forgetting the descriptors of %s failed", cgroup_path)
            if isinstance(exc, OSError):
                raise RuntimeFailure(f"cannot apply quotas to cgroup {cgroup_path}: {exc}",
                                     path=cgroup_path) from exc
            raise
        with self._lock:
            self._pending.pop(env_id, None)
            if env_id in self._withdrawn:  # a destroy unregistered it while we wrote its quotas
                self._withdrawn.discard(env_id)
                self.backend.forget(cgroup_path)
                raise EnvironmentGone(f"environment {env_id} was destroyed while it was being registered")
            state.memory = int(applied)
            if baseline is not None:
                state = self.policy.decide(state, baseline, self._node()).state
            env = _Env(env_id, cgroup_path, state, deque(maxlen=self._history_len), deque(maxlen=self._events_len))
            self._envs[env_id] = env
            self._record_history(env, time.time(), 0.0, 0)
            return {"cpu": state.cpu, "memory": state.memory, "max_cpu": state.max_cpu, "max_memory": state.max_memory}

    def unregister(self, env_id: str) -> None:
        """Stop managing the environment and release its committed quotas (the cgroup is left).
        During its `register` (quotas being written outside the lock) the registration is
        withdrawn: `register` then forgets it and raises EnvironmentGone, so a destroy that
        races a create never leaves a managed cgroup (and its cached descriptors) behind."""
        with self._lock:
            env = self._envs.pop(env_id, None)
            if env is not None:
                self.backend.forget(env.path)
            elif env_id in self._pending:
                self._withdrawn.add(env_id)

    # -- queries -------------------------------------------------------------------------------
    def committed(self) -> dict[str, Any]:
        """Node totals: committed quotas, reserve, capacity (CPU capacity already x overcommit)."""
        with self._lock:
            n = self._node()
            return {
                "cpu": n.committed_cpu, "memory": n.committed_memory,
                "reserve_cpu": n.reserve_cpu, "reserve_memory": n.reserve_memory,
                "capacity_cpu": n.cpu_capacity, "capacity_memory": n.memory_capacity,
                "held_memory": self._held(), "environments": len(self._envs),
            }  # fmt: skip

    def quotas(self, env_id: str) -> dict[str, Any]:
        with self._lock:
            env = self._get(env_id)
            s = env.state
            return {
                "cpu": s.cpu, "memory": s.memory, "max_cpu": s.max_cpu, "max_memory": s.max_memory,
                "start_cpu": s.start_cpu, "start_memory": s.start_memory, "status": env.status,
                "peak_cpu": s.peak_cpu, "peak_memory": s.peak_memory,
            }  # fmt: skip

    def history(self, env_id: str) -> list[dict[str, Any]]:
        """`[{t, cpu_limit, memory_limit, cpu_usage (cores), memory_usage}]`, oldest first (bounded)."""
        with self._lock:
            rows = list(self._get(env_id).history)
        keys = ("t", "cpu_limit", "memory_limit", "cpu_usage", "memory_usage")
        return [dict(zip(keys, r)) for r in rows]

    def events(self, env_id: str | None = None) -> list[dict[str, Any]]:
        """The decision events of one environment (or of all, time-ordered)."""
        with self._lock:
            if env_id is not None:
                return list(self._get(env_id).events)
            out = [e for env in self._envs.values() for e in env.events]
        return sorted(out, key=lambda e: e["t"])

    def stats(self, env_id: str) -> dict[str, Any]:
        """What `env stats ID --json` shows: quotas, history, events."""
        return {"quota": self.quotas(env_id), "history": self.history(env_id), "events": self.events(env_id)}

    def env_ids(self) -> list[str]:
        with self._lock:
            return list(self._envs)

    def write_latency(self) -> dict[str, Any]:
        """Latency of the last 4096 cgroup quota writes, microseconds, overall and by kind
        (`cpu`, `memory_up`, `memory_down`: lowering a v1 memory limit reclaims inside the write)."""
        with self._lock:
            rows = list(self._write_us)
        out = _percentiles([us for _, us in rows])
        kinds = sorted({k for k, _ in rows})
        out["by_kind"] = {k: _percentiles([us for kk, us in rows if kk == k]) for k in kinds}
        return out

    def loop_cost(self) -> dict[str, float]:
        """CPU the loop has used: per tick, per sample, and as % of one core over its wall time."""
        with self._lock:
            c = dict(self._cost)
        samples = max(1, c["samples"])
        c["us_per_sample"] = c["cpu_s"] / samples * 1e6  # sample + decide + apply, per environment
        c["percent_of_core"] = 100 * c["cpu_s"] / c["wall_s"] if c["wall_s"] else 0.0
        return c

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> "Provisioner":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rollstack-provisioner", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "Provisioner":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        period = self.config.sample_period_s
        started = time.monotonic()
        next_at = started
        while not self._stop.is_set():
            c0 = time.thread_time()
            try:
                self.tick()
            except Exception:  # the loop must survive anything one tick hits
                log.exception("provisioner tick failed")
            with self._lock:
                self._cost["cpu_s"] += time.thread_time() - c0
                self._cost["wall_s"] = time.monotonic() - started
            next_at += period
            delay = next_at - time.monotonic()
            if delay < 0:  # overran: skip missed ticks rather than bursting to catch up
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def tick(self) -> None:
        """One pass over every active environment: sample, decide, reclaim if needed, apply."""
        terminations: list[tuple[_Env, dict[str, Any]]] = []
        with self._lock:
            self._cost["ticks"] += 1
            node = self._node()  # O(n) once per tick, then kept current with each change's delta
            for env in list(self._envs.values()):
                if env.status != "active":
                    continue
                try:
                    sample = self.backend.sample(env.path)
                except OSError as exc:
                    env.status = "gone"
                    node = node.with_delta(-env.state.cpu, -env.state.memory)
                    self._log(env, {"t": time.monotonic(), "env": env.env_id, "signal": "cgroup_gone",
                                    "resource": "-", "old": None, "new": None, "reason": str(exc)})  # fmt: skip
                    continue
                self._cost["samples"] += 1
                before = (env.state.cpu, env.state.memory)
                try:
                    decision, reclaimed = self._decide(env, sample, node)
                    if reclaimed:
                        node = self._node()
                    self._apply(env, decision)
                except OSError as exc:  # a write failed: vanished mid-tick, or the kernel refused
                    gone = not self.backend.exists(env.path)
                    if gone:
                        env.status = "gone"
                        node = node.with_delta(-env.state.cpu, -env.state.memory)
                    self._log(env, {"t": sample.t, "env": env.env_id, "signal": "cgroup_gone" if gone else "write_failed",
                                    "resource": "-", "old": None, "new": None, "reason": str(exc)})  # fmt: skip
                    node = self._node() if not gone else node
                    continue
                if (env.state.cpu, env.state.memory) != before:
                    node = node.with_delta(env.state.cpu - before[0], env.state.memory - before[1])
                self._record_history(env, sample.t + self._wall_offset, decision.state.cpu_usage, sample.memory_usage)
                if decision.terminate is not None:
                    env.status = "terminated"
                    terminations.append((env, self._terminate_reason(env, decision.terminate)))
        for env, reason in terminations:  # callbacks outside the lock: they may call back in
            self._terminate(env, reason)

    # -- internals -----------------------------------------------------------------------------
    def _decide(self, env: _Env, sample: Any, node: Any) -> tuple[Decision, bool]:
        decision = self.policy.decide(env.state, sample, node)
        if decision.short_cpu <= 0 and decision.short_memory <= 0:
            return decision, False
        others = [e.state for e in self._envs.values() if e.status == "active"]
        plan = self.policy.plan_reclaim(others, decision.short_cpu, decision.short_memory, exclude=env.env_id)
        if not plan:
            return decision, False
        for ev in plan:
            victim = self._envs[ev["env"]]
            if ev["resource"] == "cpu":
                self._write(self.backend.set_cpu, victim.path, ev["new"])
            else:
                applied = self._write(self.backend.set_memory_quota, victim.path, int(ev["new"]), victim.state.max_memory)
                ev = dict(ev, new=int(applied))
            victim.state = self.policy.apply_reclaim(victim.state, ev, sample.t)
            self._log(victim, ev)
        return self.policy.decide(env.state, sample, self._node()), True  # same sample, more room

    def _apply(self, env: _Env, d: Decision) -> None:
        old = env.state
        state = d.state
        if d.new_cpu != old.cpu:
            self._write(self.backend.set_cpu, env.path, d.new_cpu)
        if d.new_memory != old.memory:
            applied = int(self._write(self.backend.set_memory_quota, env.path, d.new_memory, state.max_memory))
            if applied != d.new_memory:
                d.events.append({"t": state.prev.t, "env": env.env_id, "signal": "write_refused",
                                 "resource": "memory", "old": d.new_memory, "new": applied,
                                 "reason": "kernel kept the old limit (usage above the new one: EBUSY)"})  # fmt: skip
                state.memory = applied
        env.state = state
        for ev in d.events:
            self._log(env, ev)

    def _write(self, fn: Callable[..., Any], path: str, value: Any, *rest: Any, kind: str | None = None) -> Any:
        if kind is None and fn == self.backend.set_cpu:
            kind = "cpu"
        elif kind is None:
            env = next((e for e in self._envs.values() if e.path == path), None) if rest else None
            kind = "memory_down" if env is not None and value < env.state.memory else "memory_up"
        t0 = time.perf_counter()
        try:
            return fn(path, value, *rest)
        finally:
            self._write_us.append((kind, (time.perf_counter() - t0) * 1e6))

    def _log(self, env: _Env, ev: dict[str, Any]) -> None:
        ev = dict(ev, t=ev["t"] + self._wall_offset)
        env.events.append(ev)
        log.debug("provision %s", ev)

    def _record_history(self, env: _Env, t: float, cpu_usage: float, memory_usage: int) -> None:
        s = env.state
        env.history.append((t, s.cpu, s.memory, cpu_usage, memory_usage))

    def _terminate_reason(self, env: _Env, reason: dict[str, Any]) -> dict[str, Any]:
        reason = dict(reason, t=reason["t"] + self._wall_offset)
        reason["quota_history"] = [
            {"t": r[0], "cpu_limit": r[1], "memory_limit": r[2]}
            for i, r in enumerate(env.history)
            if i == 0 or r[1:3] != env.history[i - 1][1:3]
        ]
        return reason

    def _terminate(self, env: _Env, reason: dict[str, Any]) -> None:
        log.warning("provisioner terminating %s: %s", env.env_id, reason.get("cause"))
        if self.on_terminate is None:
            self.backend.kill(env.path)
            return
        try:
            self.on_terminate(env.env_id, reason)
        except Exception:
            log.exception("on_terminate callback failed for %s", env.env_id)

    def _node(self):
        cpu = 0.0
        mem = 0
        for e in self._envs.values():
            if e.status != "gone":
                cpu += e.state.cpu
                mem += e.state.memory
        for st in self._pending.values():
            cpu += st.cpu
            mem += st.memory
        return self.policy.node(cpu, mem + self._held())

    def _held(self) -> int:
        if self.held_memory is None:
            return 0
        try:
            return max(0, int(self.held_memory()))
        except Exception:  # noqa: BLE001 - a failing probe must not stop admissions or the tick
            log.exception("reading the node's held memory failed")
            return 0

    def free_memory(self) -> int:
        """Memory capacity no environment (and nothing held) has committed, reserve included."""
        with self._lock:
            n = self._node()
            return max(0, n.memory_capacity - n.committed_memory)

    def _get(self, env_id: str) -> _Env:
        env = self._envs.get(env_id)
        if env is None:
            raise EnvironmentNotFound(f"environment {env_id} is not provisioned", env=env_id)
        return env


def _percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"count": 0}
    pick = lambda q: round(percentile(xs, q), 1)  # noqa: E731 (xs is non-empty: never None)
    return {"count": len(xs), "p50_us": pick(50), "p99_us": pick(99), "max_us": round(max(xs), 1)}


def _host_capacity() -> NodeCapacity:
    import os

    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return NodeCapacity(cpu=float(os.cpu_count() or 1), memory=int(pages))
