"""The GRPO driver's error handling, policies and report, against an async fake client."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from integrations_fakes import AsyncFakeClient, FakeClient
from rollstack.errors import (
    InvalidRequest,
    GroupNotFound,
    InsufficientCapacity,
    InternalError,
    OomTerminated,
    PlanInvalid,
    RegistryUnavailable,
    Unauthorized,
)
from rollstack.integrations.grpo import AdaptiveLimit, RetryPolicy, grpo_advantages, run_batch, summarize
from rollstack.integrations.policies import FIX_PATH, RandomPolicy, ScriptedPolicy, make_policy
from rollstack.integrations.tasks import SweTask

PATCH = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"
FIX = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-b\n+a\n"
TEMPLATE = {"groups": ["os/busybox:1", "repo/{repo}:1"], "evaluator": {"groups": ["os/busybox:1"], "command": "true"}}


def tasks(n: int) -> list[SweTask]:
    return [SweTask(instance_id=f"app.1__{i}", repo="app", patch=PATCH, fix=FIX, FAIL_TO_PASS=["t"],
                    test_command="./check") for i in range(n)]


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, d: float) -> None:
        self.delays.append(d)
        await asyncio.sleep(0)


def fixed_reward(env) -> float:
    return 1.0 if FIX_PATH in env.files else 0.0


def run(client: AsyncFakeClient, n: int = 2, k: int = 3, policy=None, **kw):
    client.inner.reward_of = fixed_reward
    sleeps = Sleeps()
    report, groups = asyncio.run(run_batch(client, tasks(n), k, policy or ScriptedPolicy(), template=TEMPLATE,
                                           sleep=sleeps, **kw))
    return report, groups, sleeps


def test_scripted_policy_all_rewards_one_and_concurrency_limit() -> None:
    client = AsyncFakeClient()
    report, groups, _ = run(client, n=3, k=4, concurrency=2)
    assert [g["rewards"] for g in report["groups"]] == [[1.0] * 4] * 3
    assert all(g["advantages"] == [0.0] * 4 for g in report["groups"])
    assert report["rollouts"]["ok"] == 12 and client.max_live <= 2
    assert not client.inner.live  # every environment destroyed
    cmds = [c for c, _ in client.inner.envs[0].execs]
    assert cmds[0] == "./check" and "git apply" in cmds[1] and "patch -p1" in cmds[1] and cmds[2] == "./check"
    assert client.inner.envs[0].files[FIX_PATH] == FIX.encode()
    assert set(report["env_time"]) == {"init", "exec", "eval"}


def test_random_policy_varies_rewards_deterministically() -> None:
    r1, _, _ = run(AsyncFakeClient(), n=2, k=8, policy=RandomPolicy(0.5), seed=3)
    r2, _, _ = run(AsyncFakeClient(), n=2, k=8, policy=RandomPolicy(0.5), seed=3)
    assert [g["rewards"] for g in r1["groups"]] == [g["rewards"] for g in r2["groups"]]
    rewards = [r for g in r1["groups"] for r in g["rewards"]]
    assert 0.0 in rewards and 1.0 in rewards
    for g in r1["groups"]:
        if g["std"]:
            assert abs(sum(g["advantages"])) < 1e-3


def test_transient_create_and_evaluate_errors_are_retried_with_backoff() -> None:
    client = AsyncFakeClient()
    client.inner.create_errors = [RegistryUnavailable("503"), InsufficientCapacity("full"), RegistryUnavailable("503")]
    client.inner.eval_errors = [InsufficientCapacity("full")]
    report, groups, sleeps = run(client, n=1, k=1, retry=RetryPolicy(base_delay=1.0, jitter=0.0))
    assert report["rollouts"]["ok"] == 1 and report["groups"][0]["rewards"] == [1.0]
    assert report["rollouts"]["retries"] == {"registry_unavailable": 2, "insufficient_capacity": 2}
    assert sleeps.delays == [1.0, 2.0, 4.0, 1.0]  # exponential per call, reset for evaluate


def test_retries_are_bounded() -> None:
    client = AsyncFakeClient()
    client.inner.create_errors = [RegistryUnavailable("503")] * 10
    report, groups, sleeps = run(client, n=1, k=1, retry=RetryPolicy(max_retries=3))
    assert groups[0][0].status == "failed" and groups[0][0].error == "registry_unavailable"
    assert len(sleeps.delays) == 3 and report["groups"][0]["rewards"] == []


def test_oom_resamples_in_a_fresh_environment() -> None:
    client = AsyncFakeClient()
    kills = {"n": 0}

    def oom_first_two(env) -> None:
        if kills["n"] < 2 and len(env.execs) == 2:
            kills["n"] += 1
            raise OomTerminated("out of memory")

    client.inner.exec_hook = oom_first_two
    report, groups, _ = run(client, n=1, k=1)
    r = groups[0][0]
    assert r.status == "ok" and r.resamples == 2 and r.reward == 1.0
    assert len(client.inner.envs) == 3 and not client.inner.live
    assert report["rollouts"]["resampled"] == 2


def test_oom_resampling_is_bounded() -> None:
    client = AsyncFakeClient()

    def always(env) -> None:
        raise OomTerminated("out of memory")

    client.inner.exec_hook = always
    _, groups, _ = run(client, n=1, k=1, retry=RetryPolicy(max_resamples=1))
    assert groups[0][0].status == "failed" and groups[0][0].error == "oom_terminated"
    assert len(client.inner.envs) == 2


def test_plan_invalid_gives_up_on_the_whole_group_only() -> None:
    inner = FakeClient()
    client = AsyncFakeClient(inner)
    original = inner.create

    def create(plan):
        if plan["name"] == "app.1__0":
            raise PlanInvalid("groups: bad")
        return original(plan)

    inner.create = create
    report, groups, _ = run(client, n=2, k=4, concurrency=1)
    g0, g1 = report["groups"]
    assert g0["gave_up"] == 4 and g0["ok"] == 0 and g0["errors"] == ["plan_invalid"]
    assert g1["ok"] == 4
    assert all(r.status == "gave_up" for r in groups[0])


def test_group_not_found_and_bad_template_give_up() -> None:
    client = AsyncFakeClient()
    client.inner.create_errors = [GroupNotFound("repo/app:1")]
    report, _, _ = run(client, n=1, k=2, concurrency=1)
    assert report["groups"][0]["gave_up"] == 2
    bad = asyncio.run(run_batch(AsyncFakeClient(), tasks(1), 2, ScriptedPolicy(), template={"groups": ["{nope}"]}))[0]
    assert bad["groups"][0]["gave_up"] == 2 and bad["groups"][0]["errors"] == ["plan_invalid"]


def test_other_errors_fail_one_rollout_unauthorized_aborts() -> None:
    client = AsyncFakeClient()
    client.inner.eval_errors = [InternalError("x")]
    report, groups, _ = run(client, n=1, k=2, concurrency=1)
    assert [r.status for r in groups[0]] == ["failed", "ok"] and report["groups"][0]["rewards"] == [1.0]
    client = AsyncFakeClient()
    client.inner.create_errors = [Unauthorized("bad token")]
    with pytest.raises(Unauthorized):
        run(client, n=1, k=1)


def test_policy_bug_fails_only_its_rollout() -> None:
    class Broken:
        name = "broken"

        async def rollout(self, env, task, rng):
            raise KeyError("oops")

    report, groups, _ = run(AsyncFakeClient(), n=1, k=2, policy=Broken())
    assert all(r.status == "failed" and r.error == "KeyError" for r in groups[0])


def test_advantages_and_summary_math() -> None:
    assert grpo_advantages([]) == []
    assert grpo_advantages([1.0, 1.0]) == [0.0, 0.0]
    adv = grpo_advantages([1.0, 0.0, 1.0, 0.0])
    assert adv == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-4)
    assert RetryPolicy(base_delay=1, max_delay=5, jitter=0).delay(10, random.Random()) == 5
    assert summarize([])["rollouts"]["total"] == 0


def test_make_policy() -> None:
    assert make_policy("scripted").name == "scripted"
    assert make_policy("random", p_fix=0.2).p_fix == 0.2
    assert make_policy("rollstack.integrations.policies.ScriptedPolicy").name == "scripted"
    with pytest.raises(ValueError):
        make_policy("nonsense")
    with pytest.raises(ValueError):
        RandomPolicy(1.5)


def test_example_cli_reports_bad_input_without_traceback(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "grpo_rollouts.py"
    missing = tmp_path / "none.jsonl"
    proc = subprocess.run([sys.executable, str(example), "--tasks", str(missing), "--node", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: invalid_request:") and "Traceback" not in proc.stderr
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(tasks(1)[0].model_dump()) + "\n")
    proc = subprocess.run([sys.executable, str(example), "--tasks", str(f), "--node", "http://127.0.0.1:9",
                           "--token", "x", "--k", "1", "--max-retries", "0", "--json"],
                          capture_output=True, text=True, timeout=60)
    # node down: every rollout fails with node_unavailable, reported in the JSON document
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["rollouts"]["failed"] == 1
    assert doc["groups"][0]["errors"] == ["node_unavailable"]


def test_more_rollouts_than_node_capacity_never_deadlock_on_scoring() -> None:
    """Every live rollout waiting for an evaluator slot would deadlock a plain semaphore."""
    client = AsyncFakeClient()
    client.inner.capacity = 4
    report, groups, sleeps = run(client, n=2, k=8, concurrency=8, policy=RandomPolicy(0.5), seed=2)
    assert report["rollouts"]["ok"] == 16 and report["rollouts"]["failed"] == 0
    assert report["rollouts"]["retries"]["insufficient_capacity"] > 0 and report["rollouts"]["requeued"] > 0
    assert client.max_live <= 4 and not client.inner.live
    # the outcome does not depend on requeues: same rewards as on a roomy node
    roomy, _, _ = run(AsyncFakeClient(), n=2, k=8, concurrency=8, policy=RandomPolicy(0.5), seed=2)
    assert [g["rewards"] for g in report["groups"]] == [g["rewards"] for g in roomy["groups"]]


def test_adaptive_limit() -> None:
    async def go() -> None:
        lim = AdaptiveLimit(4)
        async with lim:
            async with lim:
                assert lim.in_use == 2
                lim.shrink()
                assert lim.limit == 1
                entered = asyncio.Event()

                async def third() -> None:
                    async with lim:
                        entered.set()

                task = asyncio.create_task(third())
                await asyncio.sleep(0.01)
                assert not entered.is_set()  # over the lowered limit: waits
        await asyncio.wait_for(task, 1)  # both left: in_use 0 < limit 1
        for _ in range(10):
            await lim.grow()
        assert lim.limit == 4  # never above the maximum
        lim.shrink()
        assert lim.limit == 1  # nothing in use: floor of 1

    asyncio.run(go())


def test_example_chooses_template_corpus_or_demo_plans(tmp_path: Path) -> None:
    import runpy

    example = runpy.run_path(str(Path(__file__).resolve().parents[3] / "examples" / "grpo_rollouts.py"))
    choose, parse = example["choose_planner"], example["parse_args"]
    tfile = tmp_path / "tasks.jsonl"
    tfile.write_text(json.dumps(tasks(1)[0].model_dump()) + "\n")
    (tmp_path / "t.yaml").write_text("groups: ['repo/{repo}:x']\n")
    planner, how = choose(parse(["--plan-template", str(tmp_path / "t.yaml")]), tfile)
    assert how.startswith("template") and planner(tasks(1)[0])["groups"] == ["repo/app:x"]
    planner, how = choose(parse([]), tfile)
    assert how == "demo template" and planner(tasks(1)[0])["groups"][0] == "os/debian-python:bookworm"
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(InvalidRequest):  # inside a corpus directory: its (here broken) manifest is used
        choose(parse([]), tfile)


def test_a_plan_with_setup_gets_its_group_in_one_create() -> None:
    """Setup commands in the plan: each task's K environments come from one group create (the
    node sets up once and forks), and nothing a rollout did not take is left behind."""
    client = AsyncFakeClient()
    template = {**TEMPLATE, "setup": ["pip install -e ."]}
    report, _ = asyncio.run(run_batch(client, tasks(3), 4, ScriptedPolicy(), template=template,
                                      sleep=lambda _s: asyncio.sleep(0), concurrency=2))
    assert client.groups == [4, 4, 4]
    assert report["rollouts"]["ok"] == 12 and [g["rewards"] for g in report["groups"]] == [[1.0] * 4] * 3
    assert not client.inner.live


def test_a_failed_group_create_leaves_each_rollout_its_own() -> None:
    client = AsyncFakeClient()
    client.inner.create_errors = [InsufficientCapacity("no room for 4")]
    template = {**TEMPLATE, "setup": ["make"]}
    report, _ = asyncio.run(run_batch(client, tasks(1), 4, ScriptedPolicy(), template=template,
                                      sleep=lambda _s: asyncio.sleep(0), concurrency=2))
    assert report["rollouts"]["ok"] == 4 and not client.inner.live
