"""The GRPO driver and the gym-like env on a real node: a small batch (2 tasks x 2 rollouts) over
the busybox corpus, rewards from the plan's evaluator, a broken task given up, the example CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adapters_fixtures import BUSYBOX_TEMPLATE, busybox_plan, swe_tasks
from rollstack import AsyncClient, Client
from rollstack.integrations.grpo import run_batch
from rollstack.integrations.gym import AsyncRolloutEnv, RolloutEnv
from rollstack.integrations.policies import RandomPolicy, ScriptedPolicy
from rollstack.integrations.tasks import SweTask

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "grpo_rollouts.py"
M = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _live(adapter_node) -> list[str]:
    with Client(adapter_node.url, token=adapter_node.token) as c:
        return [e.id for e in c.list() if e.state in ("creating", "running")]


def test_driver_scripted_and_random_rewards_and_give_up(adapter_node) -> None:
    template = yaml.safe_load(BUSYBOX_TEMPLATE)
    tasks = [SweTask.model_validate(t) for t in swe_tasks()]
    broken = SweTask.model_validate(swe_tasks()[0] | {"instance_id": "app.1.broken__2", "version": "no such version!"})

    async def go():
        async with AsyncClient(adapter_node.url, adapter_node.token) as client:
            scripted = await run_batch(client, tasks + [broken], 2, ScriptedPolicy(60), template=template,
                                       concurrency=3)
            never = await run_batch(client, tasks[:1], 2, RandomPolicy(0.0, 60), template=template, concurrency=2)
            return scripted[0], never[0]

    scripted, never = asyncio.run(go())
    g_hello, g_color, g_broken = scripted["groups"]
    assert g_hello["rewards"] == [1.0, 1.0] and g_color["rewards"] == [1.0, 1.0]
    assert g_broken["gave_up"] == 2 and g_broken["errors"] == ["plan_invalid"]
    assert scripted["env_time"]["init"]["total"] > 0 and scripted["env_time"]["eval"]["total"] > 0
    assert never["groups"][0]["rewards"] == [0.0, 0.0], never["groups"][0]["errors"]  # the bug stays
    assert _live(adapter_node) == []


def test_example_cli_small_batch(adapter_node, tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in swe_tasks()))
    (tmp_path / "template.yaml").write_text(BUSYBOX_TEMPLATE)
    cmd = [sys.executable, str(EXAMPLE), "--tasks", str(tmp_path / "tasks.jsonl"),
           "--plan-template", str(tmp_path / "template.yaml"), "--node", adapter_node.url,
           "--token", adapter_node.token, "--n-tasks", "2", "--k", "2", "--concurrency", "2"]
    proc = subprocess.run(cmd + ["--json", "--results", str(tmp_path / "r.json")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [g["rewards"] for g in doc["groups"]] == [[1.0, 1.0], [1.0, 1.0]]
    assert doc["rollouts"]["ok"] == 4 and doc["config"]["k"] == 2
    assert len(json.loads((tmp_path / "r.json").read_text())) == 2
    text = subprocess.run(cmd + ["--policy", "random", "--seed", "1"], capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "environment time" in text.stdout and "app.1.hello__0" in text.stdout


def test_gym_episode_on_a_real_environment(adapter_node) -> None:
    with RolloutEnv(node=adapter_node.url, token=adapter_node.token, max_steps=5,
                    plan_template=yaml.safe_load(BUSYBOX_TEMPLATE)) as env:
        obs, info = env.reset(swe_tasks()[0], seed=0)
        assert "hello.txt::hello" in obs and info["timings"]["total"] > 0
        obs, reward, term, trunc, info = env.step("cat hello.txt; grep -qx hello hello.txt")
        assert obs == "bug\n" and info["returncode"] == 1 and not (term or trunc)
        env.step("sed -i s/bug/hello/ hello.txt")
        obs, reward, term, trunc, info = env.step(f"echo {M}")
        assert term and reward == 1.0 and info["evaluation"]["exit_code"] == 0
        # truncation by the step limit still scores the (unfixed) state
        env.config.max_steps = 1  # limits are taken at reset
        env.reset(busybox_plan())
        obs, reward, term, trunc, info = env.step("true")
        assert trunc and not term and reward == 0.0 and info["ending"] == "step_limit"

    async def go():
        async with AsyncRolloutEnv(node=adapter_node.url, token=adapter_node.token) as aenv:
            await aenv.reset(busybox_plan())
            obs, *_ = await aenv.step("echo out; echo err >&2")
            assert obs == "out\nerr\n"

    asyncio.run(go())
    assert _live(adapter_node) == []


class _OomOnce(ScriptedPolicy):
    """Blows the memory cap in its first environment, behaves in the resampled one."""

    name = "oom-once"

    def __init__(self) -> None:
        super().__init__(60)
        self.blown = 0

    async def rollout(self, env, task, rng):
        if not self.blown:
            self.blown += 1
            await env.exec("dd if=/dev/zero bs=1M count=400 2>/dev/null | sort > /dev/null", timeout=60)
        return await super().rollout(env, task, rng)


def test_driver_resamples_after_a_real_oom(adapter_node) -> None:
    template = yaml.safe_load(BUSYBOX_TEMPLATE)
    template["resources"] = {"cpu": 0.5, "memory": "32Mi", "max_cpu": 1, "max_memory": "48Mi"}
    task = SweTask.model_validate(swe_tasks()[0])

    async def go():
        async with AsyncClient(adapter_node.url, adapter_node.token) as client:
            return await run_batch(client, [task], 1, _OomOnce(), template=template)

    report, groups = asyncio.run(go())
    r = groups[0][0]
    assert (r.status, r.resamples, r.reward) == ("ok", 1, 1.0)
    assert report["rollouts"]["resampled"] == 1
    assert _live(adapter_node) == []


def test_gym_episode_truncated_by_a_real_oom(adapter_node) -> None:
    plan = busybox_plan(resources={"cpu": 0.5, "memory": "32Mi", "max_cpu": 1, "max_memory": "48Mi"})
    with RolloutEnv(node=adapter_node.url, token=adapter_node.token) as env:
        env.reset(plan)
        obs, reward, term, trunc, info = env.step("dd if=/dev/zero bs=1M count=400 2>/dev/null | sort >/dev/null")
        assert trunc and not term and reward == 0.0 and info["error"] == "oom_terminated"
    assert _live(adapter_node) == []
