"""`QuotaPolicy`: the pure elastic-quota rules (no I/O, no clock, property-tested).

Per environment and per sample: one pressure sample grows the quota (x2 ordinary, x4 severe; CPU
and memory decided independently), sustained low usage shrinks it stepwise, never below the start
value (memory never below usage + headroom), never above the environment's cap.

Node rules (defined here, enforced by the provisioner through `NodeView`):
- *committed* = the sum of the quotas currently applied to registered environments.
- *admission* (`NodeView.admits`): a new environment fits if committed + its start quotas <=
  capacity (CPU capacity = cores x cpu_overcommit). Admission MAY use the reserve: that is what
  the reserve is for.
- *scale-up*: a grow may only raise committed up to capacity x (1 - reserve). A grow that does
  not fit is first helped by reclaiming from idle environments (`plan_reclaim`), then capped to
  what fits, else denied; every cap/denial is an event with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollstack.provision.config import NodeCapacity, PolicyConfig
from rollstack.provision.node_view import CPU_EPS, NodeView
from rollstack.provision.sample import CgroupSample

PAGE = 4096

__all__ = [
    "PolicyConfig",
    "NodeCapacity",
    "EnvState",
    "NodeView",
    "Decision",
    "QuotaPolicy",
    "Pressure",
    "cpu_pressure",
    "memory_pressure",
    "memory_floor",
]


@dataclass(slots=True)
class EnvState:
    """What the policy remembers about one environment between samples.

    Treat it as immutable: `decide` never mutates its input, it works on a `clone()` (one copy
    per sample; `dataclasses.replace` per field change cost ~30 us per decision, x1280/s).
    """

    env: str
    start_cpu: float
    start_memory: int
    max_cpu: float
    max_memory: int
    cpu: float
    """CPU quota in force (cores)."""
    memory: int
    """Memory quota in force (bytes)."""
    prev: CgroupSample | None = None
    cpu_usage: float = 0.0
    """CPU usage over the last sample interval (cores)."""
    memory_usage: int = 0
    cpu_low_since: float | None = None
    mem_low_since: float | None = None
    cpu_changed_at: float = 0.0
    mem_changed_at: float = 0.0
    oom_at_cap: int = 0
    oom_stalled: int = 0
    peak_cpu: float = 0.0
    peak_memory: int = 0
    cpu_denied: bool = False
    mem_denied: bool = False

    def clone(self, **changes: Any) -> "EnvState":
        c = object.__new__(EnvState)
        for name in _STATE_FIELDS:
            object.__setattr__(c, name, getattr(self, name))
        for name, value in changes.items():
            object.__setattr__(c, name, value)
        return c


_STATE_FIELDS = tuple(f for f in EnvState.__dataclass_fields__)


@dataclass(slots=True)  # not frozen: built 1280x/s; treat as immutable
class Decision:
    """The outcome of one sample for one environment."""

    state: EnvState
    new_cpu: float
    new_memory: int
    events: list[dict[str, Any]] = field(default_factory=list)
    terminate: dict[str, Any] | None = None
    """None, or the termination reason (code `oom_terminated`, cause, peaks, quotas)."""
    short_cpu: float = 0.0
    """CPU quota a grow wanted but the node budget did not give (the provisioner may reclaim)."""
    short_memory: int = 0


@dataclass(frozen=True)
class Pressure:
    level: int
    """0 none, 1 ordinary, 2 severe."""
    signal: str
    """What triggered it (e.g. `cpu_throttled`, `mem_under_oom`), or `low`/`ok`."""


_P: dict[tuple[int, str], Pressure] = {}


def _p(level: int, signal: str) -> Pressure:
    """Interned Pressure values (they are immutable; building one per sample costs ~1 us)."""
    key = (level, signal)
    p = _P.get(key)
    if p is None:
        p = _P[key] = Pressure(level, signal)
    return p


def cpu_pressure(config: PolicyConfig, prev: CgroupSample, cur: CgroupSample, quota: float) -> tuple[Pressure, float]:
    """CPU pressure level and usage (cores) between two samples."""
    dt = cur.t - prev.t
    usage = max(0, cur.cpu_usage_ns - prev.cpu_usage_ns) / 1e9 / dt if dt > 0 else 0.0
    periods = max(0, cur.nr_periods - prev.nr_periods)
    throttled = max(0, cur.nr_throttled - prev.nr_throttled)
    if periods and throttled / periods >= config.cpu_severe_throttled_fraction:
        return _p(2, "cpu_throttled"), usage
    if throttled:
        return _p(1, "cpu_throttled"), usage
    if usage >= config.cpu_ordinary_usage * quota:
        return _p(1, "cpu_usage_high"), usage
    if usage < config.shrink_below * quota:
        return _p(0, "low"), usage
    return _p(0, "ok"), usage


def memory_pressure(config: PolicyConfig, prev: CgroupSample, cur: CgroupSample, quota: int) -> Pressure:
    """Memory pressure level between two samples, measured against the quota in force.

    Usage thresholds apply to the working set (usage minus inactive file cache) when the backend
    read it: page cache fills any limit and is dropped first, so it is not pressure. For the same
    reason failcnt / memory.events growth counts only while the working set is a real share of
    the limit. Tasks paused under OOM are always severe.
    """
    ws = cur.memory_working_set if cur.memory_working_set is not None else cur.memory_usage
    if cur.under_oom:
        return _p(2, "mem_under_oom")
    if ws >= config.mem_severe_usage * quota:
        return _p(2, "mem_usage_severe")
    if ws >= config.mem_ordinary_usage * quota:
        return _p(1, "mem_usage_high")
    if ws >= config.mem_events_min_working_set * quota:
        if cur.failcnt > prev.failcnt:
            return _p(1, "mem_failcnt")
        if cur.events_high > prev.events_high or cur.events_max > prev.events_max:
            return _p(1, "mem_events")
    if (
        cur.pressure_total_us is not None
        and prev.pressure_total_us is not None
        and cur.pressure_total_us - prev.pressure_total_us > config.mem_pressure_us
    ):
        return _p(1, "mem_psi")
    if ws < config.shrink_below * quota:
        return _p(0, "low")
    return _p(0, "ok")


def memory_floor(config: PolicyConfig, usage: int) -> int:
    """The lowest memory quota a shrink may set for this usage: usage plus headroom, page-aligned."""
    headroom = max(int(usage * config.mem_headroom_fraction), config.mem_headroom_min)
    return _page_up(usage + headroom)


def _page_up(n: int) -> int:
    return -(-int(n) // PAGE) * PAGE


def _event(t: float, env: str, signal: str, resource: str, old: float, new: float, reason: str) -> dict[str, Any]:
    return {"t": t, "env": env, "signal": signal, "resource": resource, "old": old, "new": new, "reason": reason}


class QuotaPolicy:
    """Pure decisions: `new_state` at registration, `decide` per sample, `plan_reclaim` per node."""

    def __init__(self, config: PolicyConfig, capacity: NodeCapacity) -> None:
        self.config = config
        self.capacity = capacity

    # -- registration --------------------------------------------------------------------------
    def caps(self, max_cpu: float | None, max_memory: int | None) -> tuple[float, int]:
        """Per-environment caps: the plan's (or the defaults), clamped to the node."""
        c = self.config
        cpu = min(max_cpu if max_cpu is not None else c.default_max_cpu, self.capacity.cpu)
        mem = min(max_memory if max_memory is not None else c.default_max_memory, self.capacity.memory)
        return max(cpu, c.min_cpu), max(int(mem), c.min_memory)

    def new_state(
        self, env: str, start_cpu: float, start_memory: int, max_cpu: float | None, max_memory: int | None, t: float
    ) -> EnvState:
        cap_cpu, cap_mem = self.caps(max_cpu, max_memory)
        cpu = min(max(start_cpu, self.config.min_cpu), cap_cpu)
        mem = min(_page_up(max(start_memory, self.config.min_memory)), cap_mem)
        return EnvState(
            env=env, start_cpu=cpu, start_memory=mem, max_cpu=cap_cpu, max_memory=cap_mem,
            cpu=cpu, memory=mem, cpu_changed_at=t, mem_changed_at=t,
        )  # fmt: skip

    def node(self, committed_cpu: float, committed_memory: int) -> NodeView:
        return NodeView.of(self.capacity, self.config, committed_cpu, committed_memory)

    # -- one sample ----------------------------------------------------------------------------
    def decide(self, state: EnvState, sample: CgroupSample, node: NodeView) -> Decision:
        """Decide the next quotas for one environment from its newest sample."""
        prev = state.prev
        st = state.clone(prev=sample, memory_usage=sample.memory_usage)
        st.peak_memory = max(state.peak_memory, sample.memory_usage)
        if prev is None or sample.t <= prev.t:
            return Decision(st, state.cpu, state.memory)
        events: list[dict[str, Any]] = []
        cpu_p, cpu_usage = cpu_pressure(self.config, prev, sample, state.cpu)
        mem_p = memory_pressure(self.config, prev, sample, state.memory)
        st.cpu_usage = cpu_usage
        st.peak_cpu = max(state.peak_cpu, cpu_usage)
        if sample.oom_kill_count > prev.oom_kill_count:
            events.append(_event(sample.t, st.env, "oom_kill", "memory", st.memory, st.memory,
                                 f"kernel OOM-killed {sample.oom_kill_count - prev.oom_kill_count} task(s)"))  # fmt: skip
        new_cpu, short_cpu = self._cpu(st, cpu_p, sample.t, node, events)
        new_mem, short_mem = self._memory(st, mem_p, sample, node, events)
        terminate = self._emergency(st, sample, state.memory, new_mem, events)
        return Decision(st, new_cpu, new_mem, events, terminate, short_cpu, short_mem)

    # The helpers below mutate `st`, the decision's own clone (never the caller's state).
    def _cpu(self, st: EnvState, p: Pressure, t: float, node: NodeView, events: list) -> tuple[float, float]:
        c = self.config
        old = st.cpu
        if p.level:
            factor = c.grow_severe if p.level == 2 else c.grow_ordinary
            target = min(st.max_cpu, old * factor)
            if target <= old + CPU_EPS:
                self._deny(st, "cpu", t, p.signal, old, f"at cap {st.max_cpu:g} cores", events)
                return old, 0.0
            grant = min(target, old + node.grow_budget_cpu())
            short = target - grant
            if grant <= old + CPU_EPS:
                msg = f"denied x{factor:g}: node reserve ({node.reserve_cpu:g} cores) would be eaten"
                self._deny(st, "cpu", t, p.signal, old, msg, events)
                return old, short
            reason = f"grow x{factor:g} ({'severe' if p.level == 2 else 'ordinary'})"
            if short > CPU_EPS:
                reason += f", capped by node reserve (wanted {target:g})"
            events.append(_event(t, st.env, p.signal, "cpu", old, grant, reason))
            st.cpu, st.cpu_changed_at, st.cpu_low_since, st.cpu_denied = grant, t, None, short > CPU_EPS
            return grant, short
        st.cpu_denied = False
        if p.signal != "low":
            st.cpu_low_since = None
            return old, 0.0
        if st.cpu_low_since is None:
            st.cpu_low_since = t
        if old <= st.start_cpu + CPU_EPS or not self._sustained(st.cpu_low_since, st.cpu_changed_at, t):
            return old, 0.0
        new = max(st.start_cpu, old * c.shrink_factor)
        events.append(_event(t, st.env, "low_usage", "cpu", old, new,
                             f"shrink x{c.shrink_factor:g} after {c.shrink_after_s:g}s below {c.shrink_below:.0%}"))  # fmt: skip
        st.cpu, st.cpu_changed_at, st.cpu_low_since = new, t, t
        return new, 0.0

    def _memory(self, st: EnvState, p: Pressure, sample: CgroupSample, node: NodeView, events: list) -> tuple[int, int]:
        c = self.config
        t = sample.t
        old = st.memory
        if p.level:
            factor = c.grow_severe if p.level == 2 else c.grow_ordinary
            target = min(st.max_memory, _page_up(old * factor))
            if target <= old:
                self._deny(st, "memory", t, p.signal, old, f"at cap {st.max_memory} bytes", events)
                return old, 0
            grant = min(target, old + node.grow_budget_memory() // PAGE * PAGE)
            short = target - grant
            if grant <= old:
                msg = f"denied x{factor:g}: node reserve ({node.reserve_memory} bytes) would be eaten"
                self._deny(st, "memory", t, p.signal, old, msg, events)
                return old, short
            reason = f"grow x{factor:g} ({'severe' if p.level == 2 else 'ordinary'})"
            if short > 0:
                reason += f", capped by node reserve (wanted {target})"
            events.append(_event(t, st.env, p.signal, "memory", old, grant, reason))
            st.memory, st.mem_changed_at, st.mem_low_since, st.mem_denied = grant, t, None, short > 0
            return grant, short
        st.mem_denied = False
        if p.signal != "low":
            st.mem_low_since = None
            return old, 0
        if st.mem_low_since is None:
            st.mem_low_since = t
        if old <= st.start_memory or not self._sustained(st.mem_low_since, st.mem_changed_at, t):
            return old, 0
        new = max(st.start_memory, _page_up(old * c.shrink_factor), memory_floor(c, sample.memory_usage))
        if new >= old:
            return old, 0
        events.append(_event(t, st.env, "low_usage", "memory", old, new,
                             f"shrink x{c.shrink_factor:g} after {c.shrink_after_s:g}s below {c.shrink_below:.0%}"))  # fmt: skip
        st.memory, st.mem_changed_at, st.mem_low_since = new, t, t
        return new, 0

    def _sustained(self, low_since: float, changed_at: float, t: float) -> bool:
        w = self.config.shrink_after_s
        return t - low_since >= w and t - changed_at >= w

    def _deny(self, st: EnvState, resource: str, t: float, signal: str, old: float, why: str, events: list) -> None:
        """Record a refused grow once per episode (not every 200 ms while it persists)."""
        if resource == "cpu":
            if not st.cpu_denied:
                events.append(_event(t, st.env, signal, resource, old, old, why))
            st.cpu_denied, st.cpu_low_since = True, None
        else:
            if not st.mem_denied:
                events.append(_event(t, st.env, signal, resource, old, old, why))
            st.mem_denied, st.mem_low_since = True, None

    def _emergency(self, st: EnvState, sample: CgroupSample, old_mem: int, new_mem: int, events: list) -> dict | None:
        """Count consecutive samples paused under OOM that a grow could not relieve."""
        c = self.config
        if not sample.under_oom or new_mem > old_mem:
            st.oom_at_cap = st.oom_stalled = 0
            return None
        if new_mem >= st.max_memory:
            st.oom_at_cap, st.oom_stalled = st.oom_at_cap + 1, 0
        else:
            st.oom_at_cap, st.oom_stalled = 0, st.oom_stalled + 1
        if st.oom_at_cap > c.oom_terminate_samples:
            cause, n = "oom_at_cap", st.oom_at_cap
        elif st.oom_stalled > c.oom_stall_terminate_samples:
            cause, n = "node_memory_exhausted", st.oom_stalled
        else:
            return None
        reason = {
            "code": "oom_terminated", "cause": cause, "env": st.env, "t": sample.t,
            "consecutive_samples": n, "peak_memory": st.peak_memory, "peak_cpu": st.peak_cpu,
            "memory_limit": new_mem, "max_memory": st.max_memory, "cpu_limit": st.cpu, "max_cpu": st.max_cpu,
        }  # fmt: skip
        events.append(_event(sample.t, st.env, "mem_under_oom", "memory", new_mem, new_mem,
                             f"terminate: under OOM for {n} consecutive samples ({cause})"))  # fmt: skip
        return reason

    # -- node level ----------------------------------------------------------------------------
    def plan_reclaim(
        self, states: list[EnvState], need_cpu: float, need_memory: int, exclude: str
    ) -> list[dict[str, Any]]:
        """Shrink idle environments to make room for a grow that the reserve would otherwise block.

        Idle = usage currently below `shrink_below` of its quota (no sustain window: someone is
        waiting). A victim keeps at least its start value, CPU >= 2x its usage, memory >= usage +
        headroom. Largest reclaimable first; takes only what is needed. Returns events (`signal`
        `reclaim`) whose `new` is the quota to apply.
        """
        c = self.config
        out: list[dict[str, Any]] = []
        for resource, need in (("cpu", need_cpu), ("memory", need_memory)):
            if need <= (CPU_EPS if resource == "cpu" else 0):
                continue
            offers: list[tuple[float, EnvState, float]] = []
            for s in states:
                if s.env == exclude or s.prev is None:
                    continue
                if resource == "cpu":
                    if s.cpu_low_since is None:
                        continue
                    floor = max(s.start_cpu, 2 * s.cpu_usage, c.min_cpu)
                    spare = s.cpu - floor
                else:
                    if s.mem_low_since is None:
                        continue
                    floor = max(s.start_memory, memory_floor(c, s.memory_usage))
                    spare = s.memory - floor
                if spare > (CPU_EPS if resource == "cpu" else PAGE):
                    offers.append((spare, s, floor))
            offers.sort(key=lambda o: -o[0])
            for spare, s, floor in offers:
                if need <= 0:
                    break
                old = s.cpu if resource == "cpu" else s.memory
                take = min(spare, need)
                new = old - take if resource == "cpu" else max(int(floor), _page_up(old - take))
                if new >= old:  # a sliver too small to matter (float rounding, page alignment)
                    continue
                need -= old - new
                out.append(_event(s.prev.t, s.env, "reclaim", resource, old, new,
                                  f"idle: reclaimed for {exclude}'s scale-up"))  # fmt: skip
        return out

    def apply_reclaim(self, state: EnvState, event: dict[str, Any], t: float) -> EnvState:
        """The victim's state after a reclaim event was applied (its shrink clock restarts)."""
        if event["resource"] == "cpu":
            return state.clone(cpu=event["new"], cpu_changed_at=t, cpu_low_since=t)
        return state.clone(memory=int(event["new"]), mem_changed_at=t, mem_low_since=t)
