"""The demo's pure parts: the summary, table rows, human sizes."""

from __future__ import annotations

import json

import pytest

from rollstack_demo.report import (
    PHASES,
    TABLE_COLUMNS,
    RolloutRecord,
    StepResult,
    human_bytes,
    rich_table,
    short_task,
    summarize,
    summary_lines,
    table_rows,
)


def _record(task: str = "more-itertools.10.5.0.op_swap__0", rollout: int = 0, total: float = 1.0,
            fetched: int = 100, reward: float | None = 1.0, before: int = 1, after: int = 0,
            error: str | None = None) -> RolloutRecord:
    return RolloutRecord(
        task=task, rollout=rollout, env_id=f"e{rollout}",
        timings={**{p: total / 10 for p in PHASES}, "total": total},
        fetch={"stack_bytes": 1000, "fetched_bytes": fetched, "from_cache_bytes": 7, "from_peer_bytes": 0},
        test_before=StepResult(before, 2.0), fix=StepResult(0, 0.1), test_after=StepResult(after, 1.0),
        reward=reward, eval_seconds=3.0, destroy_seconds=0.05, wall_seconds=6.0, error=error,
    )


def test_summary_counts_outcomes_and_aggregates() -> None:
    records = [
        _record(rollout=0, total=0.8, fetched=600),
        _record(rollout=1, total=0.2, fetched=0),
        _record(rollout=2, total=0.4, fetched=0, reward=0.0, after=1),
        _record(rollout=3, reward=None, error="mutation_failed: bad patch"),
    ]
    s = summarize(records, wall_seconds=30.0)
    assert s["rollouts"] == 4 and s["errors"] == 1 and s["completed"] == 3
    assert s["bug_reproduced"] == 4 and s["fixed"] == 3
    assert s["init_p50"] == pytest.approx(0.6)  # of 0.8, 0.2, 0.4, 1.0
    assert s["mean_reward"] == pytest.approx(2 / 3) and s["rewards"] == [1.0, 1.0, 0.0]
    assert s["fetched_bytes_total"] == 700 and s["fetched_bytes_max"] == 600
    assert s["from_cache_bytes_total"] == 28 and s["stack_bytes"] == 1000
    assert s["fetched_fraction_p50"] == pytest.approx(0.05)
    assert s["rollouts_per_minute"] == pytest.approx(8.0)
    assert set(s["init_phases_p50"]) == set(PHASES)
    json.dumps(s)  # the --json document must serialise


def test_summary_of_nothing_is_well_formed() -> None:
    s = summarize([], wall_seconds=0.0)
    assert s["rollouts"] == 0 and s["mean_reward"] is None and s["init_p50"] is None
    assert s["rollouts_per_minute"] is None
    lines = summary_lines(s, {"total": 1.0})
    assert any("mean reward -" in line for line in lines)


def test_record_flags_and_dict() -> None:
    r = _record()
    assert r.bug_reproduced and r.fixed
    doc = r.to_dict()
    assert doc["bug_reproduced"] is True and doc["test_before"] == {"exit_code": 1, "seconds": 2.0, "timed_out": False}
    assert not RolloutRecord(task="t", rollout=0).bug_reproduced
    assert not _record(before=0).bug_reproduced and not _record(after=2).fixed


def test_table_rows_match_columns_and_show_errors() -> None:
    rows = table_rows([_record(), _record(rollout=1, reward=None, error="oom_terminated: out of memory"),
                       RolloutRecord(task="x.y", rollout=2, error="insufficient_capacity: full")])
    assert all(len(row) == len(TABLE_COLUMNS) for row in rows)
    assert rows[0][0] == "op_swap__0" and rows[0][-1] == "1.0"
    assert rows[0][TABLE_COLUMNS.index("tests+bug")] == "fail 2.00"
    assert rows[0][TABLE_COLUMNS.index("tests+fix")] == "pass 1.00"
    assert rows[1][-1] == "error"
    assert rows[2][TABLE_COLUMNS.index("init")] == "-" and rows[2][-1] == "error"


def test_rich_table_renders_every_row() -> None:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(rich_table([_record(rollout=i) for i in range(3)], "demo"))
    text = console.export_text()
    assert text.count("op_swap__0") == 3 and "resolve" in text


def test_human_bytes_and_short_task() -> None:
    assert human_bytes(0) == "0 B" and human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB" and human_bytes(None) == "-"
    assert short_task("more-itertools.10.5.0.op_swap__0") == "op_swap__0"
    assert short_task("plain") == "plain"
