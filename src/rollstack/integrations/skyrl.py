"""A SkyRL-gym environment over rollstack: the model's command runs in a rollstack environment,
the reward is the plan's clean evaluator.

    from rollstack.integrations.skyrl import register
    register()                                   # skyrl_gym.register("rollstack", ...), idempotent
    env = skyrl_gym.make("rollstack", env_config={"node": URL, "max_turns": 20},
                         extras={"task": swe_smith_record})      # or {"plan": dict | path | NAME:TAG}
    prompt, _ = env.init([{"role": "user", "content": "Fix the failing test."}])
    out = env.step(model_output)                 # BaseTextEnvStepOutput
    ...
    env.close()

This is how SkyRL's generator drives an environment: `skyrl_gym.make(env_class,
env_config=cfg.environment.skyrl_gym[env_class], extras=row["env_extras"])`, then `init(prompt)`,
`step(llm_output)` until `done`, `close()`. So a dataset row names `env_class: rollstack` and
carries the task (or plan) in its extras.

- `init(prompt)` creates the environment (the task's plan with its bug, as
  `rollstack.integrations.gym.RolloutEnv.reset`); the task's own prompt is appended as a user
  message when `append_task_prompt` (default: only when `prompt` is empty).
- `step(action)`: the command is the last fenced code block of the model output (```bash,
  ```sh or a bare fence; `command_pattern` overrides the regex). It runs in the environment (merged
  output, `step_timeout`), and the output is the next user message. An output with no command gets
  `no_command_message` back and still costs a turn. The episode is done on a submission (the
  command's output starts with `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, or the model output holds
  the marker and no command), at `max_turns`, or when the environment dies (reward 0,
  `metadata["error"]`). The final step's reward is `env.evaluate().reward` (on truncation too,
  unless `evaluate_on_truncation: false`); every other step's is 0.
- `close()` destroys the environment (idempotent); it is also destroyed as soon as the episode
  ends. `get_metrics()` gives turns, commands, the evaluator's reward and the create time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from rollstack.errors import InvalidRequest
from rollstack.integrations.episode import SUBMIT_MARKER
from rollstack.integrations.gym import RolloutConfig, RolloutEnv

ENV_ID = "rollstack"
ENTRY_POINT = "rollstack.integrations.skyrl:RollstackTextEnv"
COMMAND_PATTERN = r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```"
NO_COMMAND = ("No command found. Reply with exactly one shell command in a ```bash code block; "
              f"run `echo {SUBMIT_MARKER}` when you are done.")
OWN_KEYS = ("node", "token", "client", "max_turns", "command_pattern", "no_command_message", "append_task_prompt")


def plain(value: Any) -> Any:
    """An OmegaConf DictConfig/ListConfig (what SkyRL hands in) or a mapping, as plain dicts/lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


def extract_command(action: str, pattern: str = COMMAND_PATTERN, marker: str = SUBMIT_MARKER) -> str | None:
    """The command in a model output: its last matching code block; the marker itself when the
    output has no block but names the marker; else None."""
    blocks = re.findall(pattern, action, re.S)
    if blocks:
        return blocks[-1].strip("\n")
    if marker in action:
        return marker
    return None


class RollstackTextEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        config = plain(env_config or {})
        extras = plain(extras or {})
        if not isinstance(config, dict) or not isinstance(extras, dict):
            raise InvalidRequest("env_config and extras are mappings")
        self.task = extras.get("task", extras.get("plan"))
        if self.task is None:
            raise InvalidRequest("the rollstack environment needs extras['task'] (a SWE-smith record) or extras['plan']")
        self.max_turns = int(extras.get("max_turns", config.get("max_turns", 30)))
        if self.max_turns < 1:
            raise InvalidRequest("max_turns must be >= 1")
        self.pattern = str(config.get("command_pattern", COMMAND_PATTERN))
        re.compile(self.pattern)
        self.no_command = str(config.get("no_command_message", NO_COMMAND))
        self.append_task_prompt = config.get("append_task_prompt")
        rollout = {k: v for k, v in config.items() if k not in OWN_KEYS}
        if "max_steps" in rollout:
            raise InvalidRequest("the rollstack skyrl environment counts max_turns, not max_steps")
        try:
            rollout_config = RolloutConfig(**rollout, max_steps=0)  # turns are counted here (commandless ones too)
        except ValidationError as exc:
            raise InvalidRequest(f"bad rollstack env_config: {exc}") from exc
        self.rollout = RolloutEnv(config.get("client"), node=config.get("node"), token=config.get("token"),
                                  config=rollout_config)
        self.commands = 0
        self.reward: float | None = None
        self.created_seconds: float | None = None
        self.done = False

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        observation, info = self.rollout.reset(self.task)
        self.turns, self.commands, self.reward, self.done = 0, 0, None, False
        self.created_seconds = (info.get("timings") or {}).get("total")
        append = self.append_task_prompt if self.append_task_prompt is not None else not prompt
        messages = list(prompt) + ([{"role": "user", "content": observation}] if append else [])
        return messages, info

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.done:
            raise InvalidRequest("the episode is over: init() starts another")
        self.turns += 1
        command = extract_command(action, self.pattern, self.rollout.config.submit_marker)
        if command is None:
            if self.turns >= self.max_turns:
                return self._output(*self.rollout.truncate())
            return BaseTextEnvStepOutput(observations=[{"role": "user", "content": self.no_command}],
                                         reward=0.0, done=False, metadata={"no_command": True})
        self.commands += 1
        obs, reward, terminated, truncated, info = self.rollout.step(command)
        if not (terminated or truncated) and self.turns >= self.max_turns:
            _, reward, terminated, truncated, end = self.rollout.truncate()
            info |= end
        return self._output(obs, reward, terminated, truncated, info)

    def _output(self, obs: str, reward: float, terminated: bool, truncated: bool,
                info: dict[str, Any]) -> BaseTextEnvStepOutput:
        done = terminated or truncated
        if done:
            self.done = True
            self.reward = reward
        info["turn"] = self.turns
        return BaseTextEnvStepOutput(observations=[] if done else [{"role": "user", "content": obs}],
                                     reward=float(reward), done=done, metadata=info)

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "commands": self.commands, "reward": self.reward or 0.0,
                "create_seconds": self.created_seconds or 0.0}

    def close(self) -> None:
        self.rollout.close()


def register(env_id: str = ENV_ID, **kwargs: Any) -> str:
    """Register `RollstackTextEnv` with skyrl_gym under `env_id` (kwargs: defaults for `make`).
    Idempotent for the same entry point; another environment under that id is an error."""
    import skyrl_gym
    from skyrl_gym.envs.registration import registry

    existing = registry.get(env_id)
    if existing is not None:
        if existing.entry_point not in (ENTRY_POINT, RollstackTextEnv):
            raise InvalidRequest(f"skyrl_gym already has an environment {env_id!r}: {existing.entry_point}")
        return env_id
    skyrl_gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs=kwargs or None)
    return env_id
