"""RolloutEnv / AsyncRolloutEnv episode logic against fake clients."""

from __future__ import annotations

import asyncio

import pytest

from integrations_fakes import AsyncFakeClient, FakeClient
from rollstack.errors import EnvironmentGone, InvalidRequest, NodeUnavailable
from rollstack.integrations.gym import AsyncRolloutEnv, RolloutEnv, clip
from rollstack.integrations.tasks import SweTask

M = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PLAN = {"name": "p", "groups": ["os/busybox:1"], "workdir": "/w"}
TASK = {"instance_id": "app.1__0", "repo": "app", "patch": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
        "FAIL_TO_PASS": ["t::x"], "test_command": "./check"}


def test_episode_submit_scores_and_destroys() -> None:
    client = FakeClient()
    env = RolloutEnv(client, max_steps=10)
    obs, info = env.reset(PLAN)
    assert "ready" in obs and info["environment_id"] == "env-1" and info["timings"]["total"] == 0.25
    obs, reward, term, trunc, info = env.step("echo hi")
    assert (obs, reward, term, trunc) == ("hi\n", 0.0, False, False) and info["returncode"] == 0
    obs, reward, term, trunc, info = env.step(f"echo {M}")
    assert (reward, term, trunc) == (1.0, True, False)
    assert info["ending"] == "submitted" and info["evaluation"]["reward"] == 1.0 and info["steps"] == 2
    assert client.envs[0].destroyed == 1
    with pytest.raises(InvalidRequest):
        env.step("echo again")
    env.close()


def test_bare_marker_action_submits_without_running() -> None:
    client = FakeClient()
    env = RolloutEnv(client)
    env.reset(PLAN)
    _, reward, term, _, _ = env.step(f"  {M} ")
    assert term and reward == 1.0 and client.envs[0].execs == []


def test_step_limit_truncates_and_scores_optionally() -> None:
    client = FakeClient()
    client.reward_of = lambda env: 0.0
    env = RolloutEnv(client, max_steps=2)
    env.reset(PLAN)
    assert env.step("a")[3] is False
    _, reward, term, trunc, info = env.step("b")
    assert (term, trunc, info["ending"]) == (False, True, "step_limit") and client.evaluations == 1
    env2 = RolloutEnv(client, max_steps=1, evaluate_on_truncation=False)
    env2.reset(PLAN)
    _, reward, term, trunc, info = env2.step("a")
    assert trunc and reward == 0.0 and "evaluation" not in info and client.evaluations == 1


def test_time_limit_caps_command_timeout_and_truncates() -> None:
    client = FakeClient()
    env = RolloutEnv(client, max_seconds=0.05, step_timeout=30)
    env.reset(PLAN)
    import time

    time.sleep(0.06)
    _, _, term, trunc, info = env.step("ls")
    assert trunc and not term and info["ending"] == "time_limit"
    assert client.envs[0].execs[0][1]["timeout"] <= 0.05


def test_timeout_is_an_observation_not_an_end() -> None:
    env = RolloutEnv(FakeClient(), step_timeout=3)
    env.reset(PLAN)
    obs, reward, term, trunc, info = env.step("sleep 100")
    assert "timed out after 3s" in obs and info["timed_out"] and not (term or trunc)


def test_environment_death_truncates_other_errors_raise() -> None:
    client = FakeClient()
    env = RolloutEnv(client)
    env.reset(PLAN)

    def gone(_env):
        raise EnvironmentGone("reaped")

    client.exec_hook = gone
    obs, reward, term, trunc, info = env.step("ls")
    assert trunc and reward == 0.0 and info["error"] == "environment_gone" and client.evaluations == 0

    def down(_env):
        raise NodeUnavailable("down")

    env.reset(PLAN)
    client.exec_hook = down
    with pytest.raises(NodeUnavailable):
        env.step("ls")


def test_reset_with_swe_task_and_seeded_choice() -> None:
    client = FakeClient()
    tasks = [SweTask.model_validate(TASK | {"instance_id": f"app.1__{i}"}) for i in range(5)]
    template = {"groups": ["os/busybox:1", "repo/{repo}:1"], "evaluator": {"groups": ["os/busybox:1"], "command": "x"}}
    env = RolloutEnv(client, tasks=tasks, plan_template=template)
    obs1, info1 = env.reset(seed=7)
    obs2, info2 = env.reset(seed=7)
    assert info1["task_id"] == info2["task_id"] and "t::x" in obs1
    assert client.envs[0].destroyed == 1  # reset destroys the previous episode's environment
    plan = client.envs[-1].plan
    assert plan["groups"] == ["os/busybox:1", "repo/app:1"] and plan["mutation_text"].startswith("--- a/x")
    env.reset(TASK)
    assert client.envs[-1].plan["name"] == "app.1__0"
    with pytest.raises(InvalidRequest):
        RolloutEnv(client).reset()
    with pytest.raises(InvalidRequest):
        RolloutEnv(client).reset(42)


def test_observation_clipping() -> None:
    text = "x" * 100 + "y" * 100
    out = clip(text, 50)
    assert out.startswith("x" * 25) and out.endswith("y" * 25) and "150 characters elided" in out
    assert clip("short", 50) == "short"


def test_async_variant() -> None:
    async def go() -> None:
        client = AsyncFakeClient()
        async with AsyncRolloutEnv(client, max_steps=5) as env:
            obs, info = await env.reset(PLAN)
            obs, reward, term, trunc, info = await env.step("fail now")
            assert obs == "boom\n" and info["returncode"] == 2 and not term
            obs, reward, term, trunc, info = await env.step(f"echo {M}")
            assert term and reward == 1.0
        assert client.inner.envs[0].destroyed == 1 and not client.inner.closed

    asyncio.run(go())
