"""SkyRL-gym: `RollstackTextEnv` registered with `skyrl_gym.register` and built by
`skyrl_gym.make`, driven through episodes the way SkyRL's generator drives one (init, step until
done, close) on a real node; the reward is the plan's clean evaluator."""

from __future__ import annotations

import pytest
import skyrl_gym
import yaml
from omegaconf import OmegaConf

from adapters_fixtures import BUSYBOX_TEMPLATE, FIX_HELLO, busybox_plan, swe_tasks
from rollstack import Client
from rollstack.integrations.episode import SUBMIT_MARKER
from rollstack.integrations.skyrl import RollstackTextEnv, register

pytestmark = pytest.mark.integration


def bash(cmd: str) -> str:
    return f"I will run this.\n```bash\n{cmd}\n```\n"


def live(node) -> set[str]:
    with Client(node.url, node.token) as client:
        return {e.id for e in client.list() if e.state != "destroying"}  # destroyed: being reclaimed


def test_make_and_an_episode_to_a_submission(adapter_node) -> None:
    assert register() == "rollstack" and register() == "rollstack"     # idempotent
    env_config = OmegaConf.create({"node": adapter_node.url, "token": adapter_node.token, "max_turns": 6,
                                   "step_timeout": 20})                 # a DictConfig, as SkyRL passes it
    env = skyrl_gym.make("rollstack", env_config=env_config, extras={"plan": busybox_plan()})
    assert isinstance(env, RollstackTextEnv) and isinstance(env, skyrl_gym.Env)
    prompt, info = env.init([{"role": "system", "content": "You are a fixer."}, {"role": "user", "content": "Fix hello.txt"}])
    assert len(prompt) == 2 and info["environment_id"] in live(adapter_node)
    out = env.step(bash("cat hello.txt; echo err >&2; exit 2"))
    assert out["done"] is False and out["reward"] == 0.0
    assert out["observations"] == [{"role": "user", "content": "bug\nerr\n"}] and out["metadata"]["returncode"] == 2
    out = env.step("Let me think about it first.")                         # no command: a turn, no exec
    assert out["metadata"]["no_command"] and "No command found" in out["observations"][0]["content"]
    fix = FIX_HELLO.replace("\n", "\\n")
    out = env.step(bash(f"printf '{fix}' > /tmp/fix.diff && patch -p1 < /tmp/fix.diff && cat hello.txt"))
    assert out["observations"][0]["content"].endswith("hello\n")
    out = env.step(bash(f"echo {SUBMIT_MARKER}"))
    assert out["done"] is True and out["reward"] == 1.0 and out["observations"] == []
    assert out["metadata"]["ending"] == "submitted" and out["metadata"]["evaluation"]["reward"] == 1.0
    assert info["environment_id"] not in live(adapter_node)                # destroyed at the episode's end
    assert env.get_metrics() == {"turns": 4, "commands": 3, "reward": 1.0, "create_seconds": pytest.approx(info["timings"]["total"])}
    env.close()


def test_swe_task_episode_truncated_at_max_turns_scores_zero(adapter_node) -> None:
    register()
    template = yaml.safe_load(BUSYBOX_TEMPLATE)
    env = skyrl_gym.make("rollstack", env_config={"node": adapter_node.url, "token": adapter_node.token,
                                                  "plan_template": template, "max_turns": 2},
                         extras={"task": swe_tasks()[1]})
    prompt, info = env.init([])                                          # empty prompt: the task's own
    assert info["task_id"] == "app.1.color__1" and "color" in prompt[0]["content"]
    assert env.step(bash("cat color.txt"))["observations"][0]["content"] == "rde\ngreen\n"
    out = env.step("no command again")                                   # the last turn: scored, truncated
    assert out["done"] and out["reward"] == 0.0 and out["metadata"]["ending"] == "step_limit"
    assert out["metadata"]["evaluation"]["exit_code"] != 0
    assert info["environment_id"] not in live(adapter_node)
    env.close()


def test_close_mid_episode_destroys_the_environment(adapter_node) -> None:
    register()
    env = skyrl_gym.make("rollstack", env_config={"node": adapter_node.url, "token": adapter_node.token},
                         extras={"plan": busybox_plan()})
    _, info = env.init([{"role": "user", "content": "x"}])
    assert info["environment_id"] in live(adapter_node)
    env.close()
    env.close()
    assert info["environment_id"] not in live(adapter_node)


def test_adapters_demo_example(adapter_node, tmp_path) -> None:
    """examples/adapters_demo.py: one scripted episode per adapter (slime, skyrl, verifiers)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "adapters_demo.py"
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(busybox_plan()))
    (tmp_path / "fix.diff").write_text(FIX_HELLO)
    base = [sys.executable, str(example), "--plan", str(tmp_path / "plan.yaml"), "--node", adapter_node.url,
            "--token", adapter_node.token, "--command", "cat hello.txt"]
    fixed = subprocess.run(base + ["--fix", str(tmp_path / "fix.diff"), "--json"], capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stderr
    doc = json.loads(fixed.stdout)
    assert sorted(doc) == ["skyrl", "slime", "verifiers"]
    assert {name: (r["output"], r["reward"]) for name, r in doc.items()} == {
        name: ("bug\n", 1.0) for name in doc}
    plain = subprocess.run(base + ["--only", "slime,skyrl"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert len(lines) == 2 and all("reward 0.0" in line and "output bug" in line for line in lines)
    bad = subprocess.run(base + ["--only", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "invalid_request" in bad.stderr
    missing = subprocess.run(base[:3] + ["os/nope:1"] + base[4:] + ["--only", "slime"], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ")
    assert live(adapter_node).isdisjoint(r["environment"] for r in doc.values())
