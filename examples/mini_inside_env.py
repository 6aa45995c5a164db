"""mini-swe-agent's own `mini` CLI running INSIDE a rollstack environment, talking to a policy
model over the environment's allow-listed network (issue 17, docs/runtime.md "Security").

    python examples/mini_inside_env.py --store oci:/var/cache/rollstack/demo-test/store \\
        --model-endpoint 10.0.0.5:30000 [--task INSTANCE_ID] [--no-network]

The plan stacks the corpus task (os + repository + the `harness-mini-swe-agent` group, which
ships /opt/mini-swe-agent) with `network: {allow: [ENDPOINT]}`; `OPENAI_BASE_URL` and
`OPENAI_API_KEY` reference `${ROLLSTACK_ENDPOINT_0}` and the per-environment
`${ROLLSTACK_ENV_TOKEN}`. The harness runs `mini` (litellm's OpenAI client, the text-based
action format) from the task's workdir; the environment's diff is then scored by the clean
evaluator. Any OpenAI-compatible server works as the model (vLLM, SGLang, or the scripted one
the integration test starts: tests/integration/node/test_node_harness_inside.py).
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

MINI = "/opt/mini-swe-agent/bin/mini"
TASK_PROMPT = "The failing tests of this repository must pass. Fix the code, then submit."

# Runs inside the environment. The model config is written by the shell so that the endpoint
# and token (environment variables the node filled in) never appear in the plan or the config.
HARNESS = r"""set -eu
: "${OPENAI_BASE_URL:?no model endpoint configured}"
cat > /tmp/mini-model.yaml <<EOF
model:
  model_class: litellm_textbased
  model_name: openai/policy
  cost_tracking: ignore_errors
  model_kwargs: {api_base: "$OPENAI_BASE_URL", api_key: "$OPENAI_API_KEY", timeout: 20, num_retries: 0}
environment:
  environment_class: local
  cwd: "$PWD"
  timeout: 120
agent:
  step_limit: 10
EOF
export MSWEA_CONFIGURED=true MSWEA_COST_TRACKING=ignore_errors LITELLM_LOCAL_MODEL_COST_MAP=True
export MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=2  # fail fast: a rollout, not a chat session
exec MINI -c mini_textbased.yaml -c /tmp/mini-model.yaml -t "PROMPT" \
     --yolo --exit-immediately -o /tmp/mini-trajectory.json
""".replace("MINI", MINI).replace("PROMPT", TASK_PROMPT)


def plan_with_model(plan: dict[str, Any], endpoint: str | None) -> dict[str, Any]:
    """The task's plan, allowed to reach `endpoint` (HOST:PORT) only; None: no network at all
    (the harness then has the same variables, but nothing answers)."""
    out = dict(plan)
    env = dict(out.get("env", {}))
    if endpoint is None:
        env.update(OPENAI_BASE_URL="http://192.0.2.1:30000/v1", OPENAI_API_KEY="none")
    else:
        out["network"] = {"allow": [endpoint]}
        env.update(OPENAI_BASE_URL="http://${ROLLSTACK_ENDPOINT_0}/v1", OPENAI_API_KEY="${ROLLSTACK_ENV_TOKEN}")
    out["env"] = env
    return out


def scripted_replies(task: Any) -> list[str]:
    """What a scripted policy answers, call by call: run the failing tests, apply the reference
    fix, submit (mini's text-based action format)."""
    from rollstack.tasks.plans import failing_tests_command

    def act(thought: str, command: str) -> str:
        return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"

    fix = f"printf %s {shlex.quote(task.fix)} | git apply --verbose -"
    return [act("Run the failing tests first.", failing_tests_command(task) + " 2>&1 | tail -3"),
            act("Apply the fix.", fix),
            act("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]


def run(node: Any, task: Any, groups: Any, endpoint: str | None, timeout: float = 300) -> dict[str, Any]:
    """Create the environment, run `mini` inside, evaluate; returns what happened."""
    from rollstack.tasks.plans import rollout_plan

    plan = plan_with_model(rollout_plan(task, groups, 0), endpoint)
    with node.create(plan) as env:
        r = env.exec(["sh", "-c", HARNESS], timeout=timeout)
        score = env.evaluate()
        net = env.created.network
        return {"env_id": env.id, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                "network": net.model_dump() if net is not None else None,
                "uid_map": env.exec("cat /proc/self/uid_map").stdout.split(),
                "diff": env.diff(), "reward": score.reward, "evaluator_output": score.output}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True)
    p.add_argument("--root", default="/var/lib/rollstack-example-mini")
    p.add_argument("--model-endpoint", help="HOST:PORT of an OpenAI-compatible server")
    p.add_argument("--no-network", action="store_true", help="the same run with network: none")
    p.add_argument("--task", help="instance id (default: the corpus's first task)")
    a = p.parse_args()
    from rollstack.client.local import Node
    from rollstack_corpus.cache import ensure_corpus
    from rollstack.tasks.plans import stack_groups

    corpus = ensure_corpus(None, False, print)
    task = next(t for t in corpus.tasks if a.task in (None, t.instance_id))
    groups = stack_groups(corpus.manifest["components"], harness="mini-swe-agent")
    with Node(store=a.store, root=a.root) as node:
        out = run(node, task, groups, None if a.no_network else a.model_endpoint)
    print(json.dumps({k: v for k, v in out.items() if k != "diff"}, indent=1))


if __name__ == "__main__":
    main()
