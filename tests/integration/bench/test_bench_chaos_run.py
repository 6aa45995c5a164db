"""`rollstack bench chaos` end to end at a tiny size: two workers (one with a network that
fetches from the bench's upstream), an agent kill and an environment's init killed; every goal
met, the networked rollouts' egress checked, nothing left (the bench's own doctor scan)."""

from __future__ import annotations

import pytest

from rollstack_bench.chaos import run_bench

pytestmark = pytest.mark.integration


def test_chaos_bench_small() -> None:
    doc = run_bench(seconds=40, workers=2, fault_every=12, faults=["kill_env_init", "kill_agent"], fanout=2,
                    image=None, e2b=False, root_mb=1024, seed=7, branch=0.5)
    assert doc["goals"] == {"no_internal_error": True, "no_untyped_error": True, "no_data_loss": True,
                            "no_unattributed_loss": True, "nothing_left": True}, doc["rollouts"]
    assert doc["ok"] and doc["rollouts"]["completed"] > 0
    assert [f["kind"] for f in doc["faults"]] == ["kill_env_init", "kill_agent"]
    assert doc["requests"]["fork"] > 0 and doc["requests"]["exec"] > 0
    assert doc["data"]["egress_checked"] > 0  # the networked worker's environments reached the upstream
