"""Report writers: percentiles, the init summary schema, markdown, results directory, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollstack_bench.report import (
    init_summary, machine_facts, markdown_table, phase_shares, summarize, write_results,
)


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=50))
def test_percentiles_are_ordered_and_bounded(xs: list[float]) -> None:
    s = summarize(xs)
    assert s["min"] <= s["p50"] <= s["p95"] <= s["max"]
    assert s["n"] == len(xs)


def test_init_summary_has_interface_fields() -> None:
    s = init_summary([10.0, 20.0, 30.0], [0.4, 0.5], fetched_bytes=[100, 300], stack_bytes=1000)
    assert s["cold_init_p50"] == 20.0 and s["warm_init_p50"] == 0.45
    assert s["fetched_fraction"] == pytest.approx(0.2)
    assert {"cold_init_p95", "cold_runs", "warm_runs"} <= set(s)
    assert math.isnan(init_summary([], [])["fetched_fraction"])


def test_markdown_table() -> None:
    md = markdown_table({"a": {"x": 1.23456, "y": math.nan}, "b": {"x": 2}}, [("x", "X", ".2f"), ("y", "Y", ".1%")])
    lines = md.strip().splitlines()
    assert lines[0] == "| system | X | Y |"
    assert lines[1] == "|---|---:|---:|"
    assert lines[2] == "| a | 1.23 | - |" and lines[3] == "| b | 2.00 | - |"


def test_phase_shares() -> None:
    rollouts = [{"phases": [{"name": "init", "start": 0, "end": 1}, {"name": "exec", "start": 1, "end": 4}]},
                {"phases": [{"name": "eval", "start": 0, "end": 1}]}]
    assert phase_shares(rollouts) == {"init": 0.2, "exec": 0.6, "eval": 0.2}


def test_write_results_directory(tmp_path: Path) -> None:
    doc = {"systems": {"rollstack": init_summary([1.0, 2.0], [0.1]), "docker-equivalent": init_summary([20.0], [0.5])},
           "link": {"profile": "dc", "rate_bit": 1e9, "rtt_s": 0.002}}
    timeline = [{"label": f"r{i}", "phases": [{"name": "init", "start": i, "end": i + 1},
                                              {"name": "exec", "start": i + 1, "end": i + 3}]} for i in range(4)]
    out = write_results(tmp_path / "res", doc, command="rollstack bench init --quick",
                        init_samples={"rollstack": [1.0, 2.0], "docker-equivalent": [20.0]}, timeline=timeline)
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert data["command"] == "rollstack bench init --quick"
    assert data["systems"]["docker-equivalent"]["fetched_fraction"] is None  # NaN -> null
    assert data["machine"]["cores"] >= 1 and data["phase_shares"]["init"] == pytest.approx(1 / 3)
    md = (tmp_path / "res" / "results.md").read_text()
    assert "| rollstack | 1.500 |" in md and "rollstack bench init --quick" in md and "dc, 1 Gbit/s, 2 ms RTT" in md
    for key in ("init_cdf", "timeline"):
        assert Path(out[key]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_machine_facts() -> None:
    m = machine_facts()
    assert m["cores"] >= 1 and m["memory_bytes"] > 0 and m["kernel"]
