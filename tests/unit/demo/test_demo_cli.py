"""`rollstack demo` output: the human rendering of a demo document, and option checking."""

from __future__ import annotations

import json

import pytest

from rollstack.cli import demo as demo_cli
from rollstack_demo.report import PHASES, RolloutRecord, StepResult, summarize


def _doc(error: str | None = None) -> dict:
    recs = [RolloutRecord(task="more-itertools.10.5.0.op_swap__0", rollout=i, env_id=f"e{i}",
                          timings={p: 0.1 for p in PHASES},
                          fetch={"stack_bytes": 10_000, "fetched_bytes": 300 if i == 0 else 0, "from_cache_bytes": 0},
                          test_before=StepResult(1, 2.0), fix=StepResult(0, 0.1), test_after=StepResult(0, 1.0),
                          reward=1.0, eval_seconds=3.0, destroy_seconds=0.1, error=error if i else None)
            for i in range(2)]
    return {
        "store": "oci:/s", "root": "/r",
        "corpus": {"path": "/c", "flavor": "small", "tasks": 4},
        "groups": [{"component": "os", "group": "os/debian-python:bookworm", "digest": "sha256:" + "a" * 64,
                    "size": 100, "tree_bytes": 300, "uploaded_bytes": 0, "cached": True, "seconds": 0.01}],
        "rollout_stack": {"groups": ["os/debian-python:bookworm"], "files_bytes": 300, "layer_bytes": 100},
        "config": {"tasks": 1, "rollouts": 2, "concurrency": 2},
        "rollouts": [json.loads(json.dumps(r.to_dict())) for r in recs],
        "summary": summarize(recs, 10.0),
        "stages": {"corpus": 0.1, "rollouts": 10.0},
        "leftovers": {"mounts": [], "envs": [], "runc": [], "cgroups": [], "processes": []},
        "node": {"root": "/r/node", "metrics": {"lazy_fetch_transferred_bytes_registry": 50.0,
                                                "lazy_fetch_requests_registry": 3.0, "created_total": 4.0}},
        "machine": {"cpus": 2, "loadavg_start": [1.0, 1.0, 1.0], "loadavg_end": [2.0, 2.0, 2.0]},
        "ok": error is None,
    }


def test_human_rendering_shows_table_summary_and_leftovers(capsys: pytest.CaptureFixture[str]) -> None:
    demo_cli._human(_doc())
    out = capsys.readouterr().out
    assert out.count("op_swap__0") == 2
    assert "mean reward 1.00 over 2 evaluations" in out
    assert "leftovers after stop: none" in out
    assert "the coldest environment fetched 3.0% of it" in out
    assert "the node pulled 50 B from the store over the whole run (50.0% of the rollout stack's layers)" in out


def test_human_rendering_names_failed_rollouts(capsys: pytest.CaptureFixture[str]) -> None:
    demo_cli._human(_doc(error="mutation_failed: the patch does not apply"))
    out = capsys.readouterr().out
    assert "op_swap__0 #1: mutation_failed: the patch does not apply" in out
    assert "1/2 completed, 1 errors" in out


@pytest.mark.parametrize("args", [["demo", "--tasks", "0"], ["demo", "--concurrency", "100"]])
def test_bad_counts_are_usage_errors(args: list[str]) -> None:
    from rollstack.cli.main import main

    assert main(args) == 2
