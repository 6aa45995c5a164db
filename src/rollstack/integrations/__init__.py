"""Adapters that drop rollstack environments into agent and RL frameworks.

- `rollstack.integrations.minisweagent.RollstackEnvironment`: a mini-swe-agent (v2) environment
  class, loadable by dotted path (`environment_class: rollstack.integrations.minisweagent.RollstackEnvironment`);
- `rollstack.integrations.gym.RolloutEnv` / `AsyncRolloutEnv`: a gymnasium-like text environment
  (action = shell command, reward = the plan's evaluator);
- `rollstack.integrations.slime.RollstackSandbox`: slime's sandbox protocol (async context
  manager; `exec -> (rc, stdout, stderr)`, `write_file`, `read_file`);
- `rollstack.integrations.skyrl.RollstackTextEnv` + `register()`: a SkyRL-gym `BaseTextEnv`;
- `rollstack.integrations.verifiers.RollstackRuntime` + `provision()`: a verifiers v1 runtime;
- `rollstack.integrations.tasks`: SWE-smith task records -> plans (a plan template);
- `rollstack.integrations.grpo` + `policies`: the GRPO rollout driver behind
  `examples/grpo_rollouts.py` (N tasks x K rollouts, retries, resampling, advantages).

Nothing here is imported by `import rollstack`; each framework is only needed for its own adapter
(`pip install rollstack[minisweagent]`, `rollstack[adapters]` for skyrl-gym and verifiers).
"""
