"""The GRPO driver resamples a rollout whose node was lost (`node_lost`), at create or mid-rollout."""

from __future__ import annotations

import asyncio

from integrations_fakes import AsyncFakeClient
from rollstack.errors import NodeLost
from rollstack.integrations.grpo import RetryPolicy, run_batch
from rollstack.integrations.policies import FIX_PATH, ScriptedPolicy
from rollstack.integrations.tasks import SweTask

PATCH = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
FIX = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-b\n+a\n"
TEMPLATE = {"groups": ["os/busybox:1", "repo/{repo}:1"], "evaluator": {"groups": ["os/busybox:1"], "command": "true"}}


async def _no_sleep(_d: float) -> None:
    await asyncio.sleep(0)


def _run(client: AsyncFakeClient, k: int, **kw):
    client.inner.reward_of = lambda env: 1.0 if FIX_PATH in env.files else 0.0
    task = SweTask(instance_id="app.1__0", repo="app", patch=PATCH, fix=FIX, FAIL_TO_PASS=["t"], test_command="./check")
    return asyncio.run(run_batch(client, [task], k, ScriptedPolicy(), template=TEMPLATE, sleep=_no_sleep, **kw))


def test_node_lost_mid_rollout_is_resampled_and_scored() -> None:
    client = AsyncFakeClient()
    lost = {"n": 0}

    def node_dies(env) -> None:
        if lost["n"] < 2 and len(env.execs) == 2:
            lost["n"] += 1
            raise NodeLost("node n1 was lost")

    client.inner.exec_hook = node_dies
    report, groups = _run(client, k=3)
    assert [r.status for r in groups[0]] == ["ok"] * 3 and [r.reward for r in groups[0]] == [1.0] * 3
    assert report["rollouts"]["resampled"] == 2 and not client.inner.live


def test_node_lost_at_create_is_resampled_and_bounded() -> None:
    client = AsyncFakeClient()
    client.inner.create_errors = [NodeLost("node n1 was lost")]
    _, groups = _run(client, k=1)
    assert groups[0][0].status == "ok" and groups[0][0].resamples == 1
    client = AsyncFakeClient()
    client.inner.create_errors = [NodeLost("lost")] * 5
    _, groups = _run(client, k=1, retry=RetryPolicy(max_resamples=2))
    assert groups[0][0].status == "failed" and groups[0][0].error == "node_lost"
