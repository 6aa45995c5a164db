"""Pure: rollout records -> summary numbers, the JSON document, and the rich table.

No I/O besides building `rich` renderables; the runner prints them. Times are seconds, sizes
bytes. Percentiles interpolate linearly between order statistics (p50 of [1, 2] is 1.5).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from rollstack.core.stats import percentile

PHASES = ("resolve", "toc", "mount", "mutation", "start", "total")
"""The create phases the node times (interface.md, `env create --json`)."""


@dataclass
class StepResult:
    """One agent command: its exit code and how long it ran inside the environment."""

    exit_code: int
    seconds: float
    timed_out: bool = False


@dataclass
class RolloutRecord:
    """Everything measured about one rollout (None: the step did not happen)."""

    task: str
    rollout: int
    env_id: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """create phases, see PHASES"""
    fetch: dict[str, int] = field(default_factory=dict)
    """stack_bytes, fetched_bytes, from_cache_bytes, from_peer_bytes"""
    test_before: StepResult | None = None
    """the failing tests, before the fix (the bug must make them fail)"""
    fix: StepResult | None = None
    test_after: StepResult | None = None
    reward: float | None = None
    eval_seconds: float | None = None
    """evaluate(): diff + clean evaluator environment + scorer + its destroy"""
    eval_run_seconds: float | None = None
    """the scorer alone, inside the evaluator environment"""
    diff_files: int | None = None
    """files the rollout's diff touches (the bug and its fix cancel out: 0 when fixed exactly)"""
    destroy_seconds: float | None = None
    wall_seconds: float = 0.0
    capacity_retries: int = 0
    """creates/evaluations the node refused for lack of capacity and the agent retried"""
    error: str | None = None
    """`code: message` of the first failure, if any"""

    @property
    def bug_reproduced(self) -> bool:
        return self.test_before is not None and self.test_before.exit_code != 0

    @property
    def fixed(self) -> bool:
        return self.test_after is not None and self.test_after.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["bug_reproduced"], doc["fixed"] = self.bug_reproduced, self.fixed
        return doc


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Sequence[RolloutRecord], wall_seconds: float) -> dict[str, Any]:
    """The summary block: counts, p50/p95 of init and steps, bytes, rewards."""
    created = [r for r in records if r.timings]
    rewards = [r.reward for r in records if r.reward is not None]
    fetched = [r.fetch.get("fetched_bytes", 0) for r in created]
    stack = [r.fetch.get("stack_bytes", 0) for r in created]
    fractions = [f / s for f, s in zip(fetched, stack) if s]

    def p(values: list[float], q: float) -> float | None:
        return percentile(values, q)

    def step(name: str) -> list[float]:
        return [getattr(r, name).seconds for r in records if getattr(r, name) is not None]

    return {
        "rollouts": len(records),
        "completed": sum(1 for r in records if r.error is None and r.reward is not None),
        "errors": sum(1 for r in records if r.error is not None),
        "capacity_retries": sum(r.capacity_retries for r in records),
        "bug_reproduced": sum(1 for r in records if r.bug_reproduced),
        "fixed": sum(1 for r in records if r.fixed),
        "init_p50": p([r.timings["total"] for r in created if "total" in r.timings], 50),
        "init_p95": p([r.timings["total"] for r in created if "total" in r.timings], 95),
        "init_phases_p50": {ph: p([r.timings.get(ph, 0.0) for r in created], 50) for ph in PHASES},
        "stack_bytes": max(stack) if stack else 0,
        "fetched_bytes_total": sum(fetched),
        "fetched_bytes_max": max(fetched) if fetched else 0,
        "from_cache_bytes_total": sum(r.fetch.get("from_cache_bytes", 0) for r in created),
        "from_peer_bytes_total": sum(r.fetch.get("from_peer_bytes", 0) for r in created),
        "fetched_fraction_p50": p(fractions, 50),
        "fetched_fraction_max": max(fractions) if fractions else None,
        "test_before_p50": p(step("test_before"), 50),
        "test_after_p50": p(step("test_after"), 50),
        "fix_p50": p(step("fix"), 50),
        "eval_p50": p([r.eval_seconds for r in records if r.eval_seconds is not None], 50),
        "destroy_p50": p([r.destroy_seconds for r in records if r.destroy_seconds is not None], 50),
        "mean_reward": _mean(rewards),
        "rewards": rewards,
        "wall_seconds": round(wall_seconds, 3),
        "rollouts_per_minute": round(60.0 * len(records) / wall_seconds, 2) if wall_seconds > 0 else None,
    }


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def secs(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _step_cell(s: StepResult | None) -> str:
    """`fail 2.31` / `pass 0.80` (exit code 0 = pass), `timeout`, or `-` when it did not run."""
    if s is None:
        return "-"
    if s.timed_out:
        return f"timeout {s.seconds:.1f}"
    return f"{'pass' if s.exit_code == 0 else 'fail'} {s.seconds:.2f}"


def _fix_cell(s: StepResult | None) -> str:
    if s is None:
        return "-"
    return f"{s.seconds:.2f}" if s.exit_code == 0 else f"exit {s.exit_code}"


def short_task(task: str) -> str:
    """`more-itertools.10.5.0.op_swap__0` -> `op_swap__0` (the version is in the group table)."""
    parts = task.rsplit(".", 1)
    return parts[-1] if len(parts) == 2 and parts[-1] else task


TABLE_COLUMNS = ("task", "#", "resolve", "toc", "mount", "mutate", "start", "init",
                 "fetched", "cache", "tests+bug", "fix", "tests+fix", "evaluate", "destroy", "reward")
"""Phase and step times in seconds; `fetched`: bytes pulled from the store before the environment
was ready, `cache`: bytes the node's chunk cache served then."""
_LEFT = {"task", "tests+bug", "tests+fix"}


def table_rows(records: Sequence[RolloutRecord]) -> list[list[str]]:
    """One row of strings per rollout, in TABLE_COLUMNS order."""
    rows = []
    for r in records:
        t = r.timings
        fetched = r.fetch.get("fetched_bytes") if r.fetch else None
        rows.append([
            short_task(r.task), str(r.rollout),
            *[secs(t.get(ph)) if t else "-" for ph in PHASES],
            human_bytes(fetched) if r.fetch else "-",
            human_bytes(r.fetch.get("from_cache_bytes")) if r.fetch else "-",
            _step_cell(r.test_before), _fix_cell(r.fix), _step_cell(r.test_after),
            secs(r.eval_seconds), secs(r.destroy_seconds),
            "error" if r.error else secs(r.reward, 1),  # the runner lists each error in full below
        ])
    return rows


def rich_table(records: Sequence[RolloutRecord], title: str) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, collapse_padding=True)
    for name in TABLE_COLUMNS:
        table.add_column(name, justify="left" if name in _LEFT else "right", no_wrap=True)
    for row in table_rows(records):
        table.add_row(*row)
    return table


def summary_lines(summary: dict[str, Any], stages: dict[str, float]) -> list[str]:
    """The lines printed under the table."""
    s = summary
    ph = s["init_phases_p50"]
    phases = "  ".join(f"{k} {secs(ph.get(k), 3)}" for k in PHASES[:-1])
    mean = "-" if s["mean_reward"] is None else f"{s['mean_reward']:.2f}"
    frac = s.get("fetched_fraction_max")
    lines = [
        f"rollouts: {s['completed']}/{s['rollouts']} completed, {s['errors']} errors"
        + (f" ({s['capacity_retries']} retries after insufficient_capacity)" if s.get("capacity_retries") else "")
        + "; "
        f"bug reproduced {s['bug_reproduced']}/{s['rollouts']}, fixed {s['fixed']}/{s['rollouts']}",
        f"init p50 {secs(s['init_p50'], 3)} s (p95 {secs(s['init_p95'], 3)} s); phases p50: {phases}",
        f"read before ready: from the store {human_bytes(s['fetched_bytes_total'])} in all "
        f"(at most {human_bytes(s['fetched_bytes_max'])} for one), from the node cache "
        f"{human_bytes(s['from_cache_bytes_total'])}; stack {human_bytes(s['stack_bytes'])} of layers"
        + ("" if frac is None else f"; the coldest environment fetched {100 * frac:.1f}% of it"),
        f"exec p50: tests with the bug {secs(s['test_before_p50'])} s, fix {secs(s['fix_p50'])} s, "
        f"tests fixed {secs(s['test_after_p50'])} s; evaluate p50 {secs(s['eval_p50'])} s; "
        f"destroy p50 {secs(s['destroy_p50'])} s",
        f"mean reward {mean} over {len(s['rewards'])} evaluations",
        "time: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()),
    ]
    return lines
