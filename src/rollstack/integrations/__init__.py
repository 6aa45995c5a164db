"""Adapters that drop rollstack environments into agent and RL frameworks.

- `rollstack.integrations.minisweagent.RollstackEnvironment`: a mini-swe-agent (v2) environment
  class, loadable by dotted path (`environment_class: rollstack.integrations.minisweagent.RollstackEnvironment`);
- `rollstack.integrations.gym.RolloutEnv` / `AsyncRolloutEnv`: a gymnasium-like text environment
  (action = shell command, reward = the plan's evaluator);
- `rollstack.integrations.tasks`: SWE-smith task records -> plans (a plan template);
- `rollstack.integrations.grpo` + `policies`: the GRPO rollout driver behind
  `examples/grpo_rollouts.py` (N tasks x K rollouts, retries, resampling, advantages).

Nothing here is imported by `import rollstack`; mini-swe-agent is only needed for its adapter
(`pip install rollstack[minisweagent]`).
"""
