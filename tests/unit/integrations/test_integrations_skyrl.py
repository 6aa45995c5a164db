"""`RollstackTextEnv` (skyrl-gym) logic against fake clients: command extraction, turn limits,
config handling and registration."""

from __future__ import annotations

import pytest
import skyrl_gym
from omegaconf import OmegaConf

from integrations_fakes import FakeClient
from rollstack.errors import InvalidRequest
from rollstack.integrations.episode import SUBMIT_MARKER
from rollstack.integrations.skyrl import RollstackTextEnv, extract_command, plain, register

PLAN = {"name": "p", "groups": ["os/busybox:1"], "workdir": "/w"}


def test_extract_command() -> None:
    assert extract_command("x\n```bash\nls -l\n```\ny\n```sh\npwd\n```") == "pwd"   # the last block
    assert extract_command("```\necho a\necho b\n```") == "echo a\necho b"
    assert extract_command("```python\nprint(1)\n```") is None                      # not a shell block
    assert extract_command(f"I am done: {SUBMIT_MARKER}") == SUBMIT_MARKER
    assert extract_command("nothing here") is None
    assert extract_command("<cmd>ls</cmd>", r"<cmd>(.*?)</cmd>") == "ls"


def test_plain_converts_omegaconf() -> None:
    cfg = OmegaConf.create({"a": {"b": [1, {"c": 2}]}})
    assert plain(cfg) == {"a": {"b": [1, {"c": 2}]}} and type(plain(cfg)["a"]["b"]) is list


def test_turn_limit_scores_after_a_command() -> None:
    client = FakeClient()
    env = RollstackTextEnv({"client": client, "max_turns": 2}, {"plan": PLAN})
    prompt, info = env.init([{"role": "user", "content": "go"}])
    assert prompt == [{"role": "user", "content": "go"}] and info["environment_id"] == "env-1"
    assert env.step("```bash\necho hi\n```")["observations"] == [{"role": "user", "content": "hi\n"}]
    out = env.step("```bash\necho again\n```")
    assert out["done"] and out["reward"] == 1.0 and out["metadata"]["ending"] == "step_limit"
    assert client.evaluations == 1 and client.envs[0].destroyed == 1
    with pytest.raises(InvalidRequest):
        env.step("```bash\nls\n```")
    prompt, _ = env.init([])                        # a new episode in a fresh environment
    assert prompt[0]["role"] == "user" and len(client.envs) == 2
    out = env.step(f"```bash\necho {SUBMIT_MARKER}\n```")
    assert out["done"] and out["metadata"]["ending"] == "submitted"
    env.close()


def test_truncation_without_scoring() -> None:
    client = FakeClient()
    env = RollstackTextEnv({"client": client, "max_turns": 1, "evaluate_on_truncation": False}, {"plan": PLAN})
    env.init([])
    out = env.step("no command")
    assert out["done"] and out["reward"] == 0.0 and client.evaluations == 0


@pytest.mark.parametrize("config,extras", [
    ({}, {}),                                           # no task
    ({"max_turns": 0}, {"plan": PLAN}),
    ({"max_steps": 3}, {"plan": PLAN}),
    ({"no_such_option": 1}, {"plan": PLAN}),
    ({"command_pattern": "("}, {"plan": PLAN}),
])
def test_bad_config(config, extras) -> None:
    with pytest.raises(Exception) as exc:
        RollstackTextEnv({"client": FakeClient(), **config}, extras)
    assert isinstance(exc.value, (InvalidRequest, __import__("re").error))


def test_register_is_idempotent_and_refuses_a_clash() -> None:
    assert register() == "rollstack" and register() == "rollstack"
    assert isinstance(skyrl_gym.make("rollstack", env_config={"client": FakeClient()}, extras={"plan": PLAN}),
                      RollstackTextEnv)
    with pytest.raises(InvalidRequest):
        register("gsm8k")                               # skyrl_gym's own
