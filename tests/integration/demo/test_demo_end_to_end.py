"""The demo on the real small corpus: 1 task x 2 rollouts through `run_demo`, plus a control rollout.

Real everything: the corpus (debootstrap bookworm + python3, more-itertools with its tests,
mini-swe-agent, the evaluator; built once and cached by the corpus builder, ~3-5 min on a fresh
machine), an OCI layout store and publish cache under a stable directory (so a second run in the
same CI job converts nothing), and a node with a FRESH root per test (cold chunk cache: the lazy
store really fetches). Asserts what the demo claims: the bug makes its tests fail, the fix makes
them pass, the evaluator scores 1.0 (and 0.0 for an agent that fixes nothing), and nothing is
left behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components import require_root
from corpus_helpers import CACHE, published_corpus
from rollstack_demo.config import DemoConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]



def _log(msg: str) -> None:
    print(f"[demo-test] {msg}", flush=True)


@pytest.fixture(scope="module")
def published() -> tuple[object, str]:
    """The small corpus, built (cached) and published to the test store (cached)."""
    require_root()  # the demo needs debootstrap, FUSE, overlayfs, runc, cgroups
    return published_corpus(_log)


def test_demo_runs_rollouts_that_really_fail_then_pass(published: tuple[object, str], tmp_path: Path) -> None:
    from rollstack_demo.runner import run_demo

    _, spec = published
    node_dir = tmp_path / "node"
    doc = run_demo(DemoConfig(store=spec, root=CACHE, node_dir=node_dir, tasks=1, rollouts=2, concurrency=2,
                              log=_log))

    assert all(g["cached"] for g in doc["groups"])  # the fixture published them: nothing converted again
    assert doc["summary"]["rollouts"] == 2 and doc["summary"]["errors"] == 0, doc["rollouts"]
    assert {r["rollout"] for r in doc["rollouts"]} == {0, 1}
    assert len({r["env_id"] for r in doc["rollouts"]}) == 2
    for r in doc["rollouts"]:
        assert r["error"] is None
        assert r["test_before"]["exit_code"] not in (0, None) and not r["test_before"]["timed_out"]  # the bug bites
        assert r["fix"]["exit_code"] == 0
        assert r["test_after"]["exit_code"] == 0  # the fix works inside the environment
        assert r["reward"] == 1.0  # ... and in the clean evaluator environment
        assert r["diff_files"] == 0  # the reference fix restores the original bytes exactly
        assert set(r["timings"]) >= {"resolve", "toc", "mount", "mutation", "start", "total"}
        assert r["timings"]["total"] > 0 and r["timings"]["mutation"] > 0
        assert 0 < r["fetch"]["stack_bytes"]
    stack = doc["summary"]["stack_bytes"]
    # A cold node pulls what the rollouts read (python, pytest, the repository), far from the whole stack.
    pulled = doc["node"]["metrics"]["lazy_fetch_transferred_bytes_registry"]
    assert 0 < pulled < stack / 2
    assert doc["summary"]["fetched_bytes_max"] < stack / 2
    assert doc["node"]["metrics"]["created_total"] == 4  # 2 rollouts + their 2 evaluator environments
    assert doc["summary"]["mean_reward"] == 1.0
    assert doc["leftovers"] == {"mounts": [], "envs": [], "runc": [], "cgroups": [], "processes": []}
    assert doc["ok"] is True
    # The node root holds no environment after the run, and nothing is mounted under it.
    assert not any((node_dir / "envs").iterdir()) if (node_dir / "envs").exists() else True
    with open("/proc/self/mountinfo") as f:
        assert str(node_dir) not in f.read()


def test_an_agent_that_fixes_nothing_scores_zero(published: tuple[object, str], tmp_path: Path) -> None:
    from rollstack_demo.agent import run_rollout
    from rollstack.tasks.plans import stack_groups
    from rollstack_demo.runner import child_processes, find_leftovers
    from rollstack.client.local import Node

    corpus, spec = published
    task = corpus.tasks[-1]
    node_dir = tmp_path / "node"
    before = set(child_processes())
    with Node(store=spec, root=node_dir) as node:
        rec = run_rollout(node, task, stack_groups(corpus.manifest["components"]), 0, apply_fix=False)
        assert node.service.wait_destroyed(120)  # background teardowns ('destroying' until done)
        assert node.list() == []  # destroyed, the evaluator's environment too
        ids = {rec.env_id} | set(getattr(node.service, "_gone", {}))
    assert rec.error is None, rec.error
    assert rec.fix is None
    assert rec.test_before.exit_code != 0 and rec.test_after.exit_code != 0
    assert rec.diff_files == 1  # the bug itself is the rollout's diff
    assert rec.reward == 0.0
    assert find_leftovers(node_dir, ids, ignore_children=before) == {"mounts": [], "envs": [], "runc": [], "cgroups": [], "processes": []}
