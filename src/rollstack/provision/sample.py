"""`CgroupSample`: one reading of an environment's cgroup, the same shape on cgroup v1 and v2.

Counters are cumulative as the kernel reports them; the policy works on deltas between two
samples, so a backend never has to remember anything between reads.
"""

from __future__ import annotations

from dataclasses import dataclass


# Not frozen: a frozen __init__ costs ~1 us more per sample, x1280/s. Field ORDER is part of the
# contract (CgroupV1.sample builds it positionally).
@dataclass(slots=True)
class CgroupSample:
    """One reading of a cgroup (treat as immutable). Units as the fields name; counters cumulative."""

    t: float
    """Monotonic time of the reading, seconds."""
    cpu_usage_ns: int
    """Total CPU time used by the cgroup (v1 `cpuacct.usage`; v2 `cpu.stat usage_usec` x 1000)."""
    nr_periods: int
    """CFS enforcement periods that had runnable tasks (`cpu.stat nr_periods`)."""
    nr_throttled: int
    """Periods in which the cgroup exhausted its quota and was throttled."""
    throttled_ns: int
    """Total time throttled (v1 `throttled_time` ns; v2 `throttled_usec` x 1000)."""
    memory_usage: int
    """Bytes charged now (v1 `memory.usage_in_bytes`; v2 `memory.current`)."""
    memory_limit: int
    """The elastic memory quota in force (v1 `memory.limit_in_bytes`; v2 `memory.high`, else `memory.max`)."""
    failcnt: int = 0
    """v1: times usage hit the limit (`memory.failcnt`). v2: 0."""
    events_high: int = 0
    """v2: `memory.events high` (times throttled over memory.high). v1: 0."""
    events_max: int = 0
    """v2: `memory.events max` (times usage hit memory.max). v1: 0."""
    oom_kill_count: int = 0
    """Processes killed by the OOM killer in this cgroup (v1 oom_control `oom_kill`; v2 events `oom_kill`)."""
    under_oom: bool = False
    """v1: tasks are paused at the limit (`under_oom 1`, needs oom_kill_disable). v2: usage at memory.max
    with `max` events growing is reported by the backend as under_oom."""
    pressure_total_us: int | None = None
    """PSI `some total=` of memory.pressure in microseconds (v2, or v1 hosts with PSI); None if absent."""
    cpu_pressure_total_us: int | None = None
    """PSI `some total=` of cpu.pressure in microseconds; None if absent."""
    cpu_limit: float | None = None
    """The CPU quota in force in cores (None = unlimited)."""
    memory_working_set: int | None = None
    """Usage minus inactive file cache (what reclaim cannot simply drop), read only when usage is
    at least half the limit; None means "not read: take memory_usage"."""
