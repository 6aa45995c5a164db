"""`PolicyConfig` and `NodeCapacity`: the explicit values the quota policy runs on (no globals)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MiB = 1 << 20
GiB = 1 << 30


class PolicyConfig(BaseModel):
    """Every threshold of the elastic quota policy. Defaults follow the paper, tuned on this host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sample_period_s: float = Field(0.2, gt=0)
    """How often the provisioner samples every environment (seconds)."""

    cpu_ordinary_usage: float = Field(0.8, gt=0, le=1)
    """CPU ordinary pressure: usage over the last period >= this fraction of the quota (or any
    throttled period since the last sample)."""
    cpu_severe_throttled_fraction: float = Field(0.5, gt=0, le=1)
    """CPU severe pressure: throttled periods / periods since the last sample >= this. A 200 ms
    sample spans two 100 ms CFS periods, so 0.5 means "throttled in at least one of them while
    runnable in at most two"; a busy task over its quota scores 1.0."""

    mem_ordinary_usage: float = Field(0.8, gt=0, le=1)
    """Memory ordinary pressure: working set (usage minus inactive file cache, when read) >= this
    fraction of the limit, or failcnt (v1) / memory.events high or max (v2) grew (see
    `mem_events_min_working_set`), or PSI memory `some` grew by more than `mem_pressure_us`."""
    mem_severe_usage: float = Field(0.95, gt=0, le=1)
    """Memory severe pressure: usage >= this fraction of the limit, or tasks paused under OOM."""
    mem_events_min_working_set: float = Field(0.5, ge=0, le=1)
    """failcnt / memory.events growth counts as pressure only while the working set (usage minus
    inactive file cache) is at least this fraction of the limit: hitting the limit with page
    cache just makes the kernel drop cache."""
    mem_pressure_us: int = Field(10_000, ge=0)
    """PSI memory `some total` growth per sample (us) that counts as ordinary pressure (10 ms in a
    200 ms sample = 5% of the time stalled). PSI totals are used because avg10 refreshes only every 2 s."""

    grow_ordinary: float = Field(2.0, gt=1)
    """Quota multiplier on one ordinary-pressure sample."""
    grow_severe: float = Field(4.0, gt=1)
    """Quota multiplier on one severe-pressure sample."""

    shrink_below: float = Field(0.25, gt=0, lt=1)
    """Usage below this fraction of the quota counts as low."""
    shrink_after_s: float = Field(10.0, ge=0)
    """Low usage must last this long before a shrink step, and steps are at least this far apart."""
    shrink_factor: float = Field(0.5, gt=0, lt=1)
    """Each shrink step multiplies the quota by this (never below the start value)."""
    mem_headroom_fraction: float = Field(0.25, ge=0)
    """A memory shrink keeps at least usage x (1 + this) ..."""
    mem_headroom_min: int = Field(64 * MiB, ge=0)
    """... and at least usage + this many bytes (v1 refuses a limit under usage; v2 would OOM-kill)."""

    default_max_cpu: float = Field(64.0, gt=0)
    """Per-environment CPU cap (cores) when the plan gives none; always clamped to the node's cores."""
    default_max_memory: int = Field(32 * GiB, gt=0)
    """Per-environment memory cap (bytes) when the plan gives none; clamped to the node's memory."""

    reserve_cpu_fraction: float = Field(0.2, ge=0, lt=1)
    """Share of the node's CPU quota capacity that scale-ups may not eat (kept for admissions)."""
    reserve_memory_fraction: float = Field(0.2, ge=0, lt=1)
    """Share of the node's memory that scale-ups may not eat (kept for admissions)."""
    cpu_overcommit: float = Field(4.0, ge=1)
    """CPU quotas are ceilings on a compressible resource (CFS shares cores fairly when the
    ceilings oversubscribe them), so the sum of CPU quotas may reach cores x this. Memory is
    incompressible and is never overcommitted."""

    oom_terminate_samples: int = Field(10, ge=1)
    """An environment paused under OOM with its memory quota at its cap for more than this many
    consecutive samples is terminated (reported `oom_terminated`)."""
    oom_stall_terminate_samples: int = Field(50, ge=1)
    """An environment paused under OOM below its cap whose growth the node keeps denying for more
    than this many consecutive samples is terminated too (cause `node_memory_exhausted`)."""

    min_cpu: float = Field(0.01, gt=0)
    """Smallest CPU quota ever applied (the kernel's minimum is 1 ms per 100 ms period)."""
    min_memory: int = Field(8 * MiB, gt=0)
    """Smallest memory quota ever applied."""


class NodeCapacity(BaseModel):
    """What the node offers to environments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: float = Field(gt=0)
    """Cores available to environments."""
    memory: int = Field(gt=0)
    """Bytes available to environments."""
