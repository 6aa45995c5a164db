"""mini-swe-agent itself (DefaultAgent + DeterministicModel) through a real rollstack environment:
overlayfs + runc on a real node over HTTP, to a submission that the plan's evaluator scores 1.0."""

from __future__ import annotations

import os

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import pytest
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

from adapters_fixtures import busybox_plan
from rollstack import Client

pytestmark = pytest.mark.integration
M = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _env(adapter_node, **kw):
    return get_environment({
        "environment_class": "rollstack.integrations.minisweagent.RollstackEnvironment",
        "plan": busybox_plan(), "node": adapter_node.url, "token": adapter_node.token, **kw,
    })


def test_default_agent_submits_through_a_real_environment(adapter_node) -> None:
    env = _env(adapter_node, timeout=20)
    try:
        env_id = env.environment_id
        model = DeterministicModel(outputs=[
            make_output("look", [{"command": "cat hello.txt; echo to-stderr >&2; pwd; echo $TASK"}]),
            make_output("fix", [{"command": "sed -i s/bug/hello/ hello.txt"}]),
            make_output("submit", [{"command": f"echo {M}; cat hello.txt"}]),
        ])
        agent = DefaultAgent(model, env, system_template="sys", instance_template="{{task}}", step_limit=10)
        result = agent.run("fix hello.txt")
        assert result["exit_status"] == "Submitted" and result["submission"] == "hello\n"
        first_obs = agent.messages[3]["extra"]
        # the mutation was applied at init; stderr merged in order; the plan's workdir and env
        assert first_obs["raw_output"] == "bug\nto-stderr\n/work/app\nhello\n"
        assert first_obs["returncode"] == 0
        with Client(adapter_node.url, token=adapter_node.token) as client:
            assert client.get(env_id).evaluate().reward == 1.0
            traj = agent.serialize()
            assert traj["info"]["rollstack"]["environment_id"] == env_id
            assert adapter_node.token not in str(traj)
    finally:
        env.cleanup()
    with Client(adapter_node.url, token=adapter_node.token) as client:
        assert env_id not in [e.id for e in client.list() if e.state not in ("destroyed", "destroying")]


def test_timeout_exit_codes_and_submission_rules(adapter_node) -> None:
    env = _env(adapter_node, lazy=True, cwd="/tmp")
    try:
        assert env.environment_id is None
        out = env.execute({"command": "echo start; sleep 30"}, timeout=1)
        assert out["returncode"] == -1 and out["extra"]["exception_type"] == "TimeoutExpired"
        assert "timed out after 1 seconds" in out["exception_info"]
        out = env.execute({"command": "pwd; exit 3"})
        assert out == {"output": "/tmp\n", "returncode": 3, "exception_info": ""}
        out = env.execute({"command": f"echo {M}; exit 1"})  # not a submission: non-zero exit
        assert out["returncode"] == 1
        with pytest.raises(Submitted) as info:
            env.execute({"command": f"echo; echo {M}; echo patch"}, cwd="/work/app")
        assert info.value.messages[0]["extra"]["submission"] == "patch\n"
    finally:
        env.cleanup()


def test_mini_cli_loads_the_environment_by_dotted_path(adapter_node, tmp_path) -> None:
    """mini-swe-agent's own `mini` command, configured only by YAML, runs to a submission; the
    environment is destroyed when the process exits."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(busybox_plan()))
    (tmp_path / "env.yaml").write_text(
        "environment:\n"
        "  environment_class: rollstack.integrations.minisweagent.RollstackEnvironment\n"
        f"  plan: {tmp_path / 'plan.yaml'}\n"
        "  timeout: 30\n"
    )
    outputs = [
        {"role": "assistant", "content": "fix", "extra": {"actions": [{"command": "sed -i s/bug/hello/ hello.txt"}]}},
        {"role": "assistant", "content": "done", "extra": {"actions": [{"command": f"echo {M}; cat hello.txt"}]}},
    ]
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"model": {
        "model_class": "minisweagent.models.test_models.DeterministicModel", "model_name": "deterministic",
        "outputs": outputs}}))
    mini = Path(sys.executable).with_name("mini")
    env = dict(os.environ, ROLLSTACK_NODE=adapter_node.url, ROLLSTACK_TOKEN=adapter_node.token,
               MSWEA_CONFIGURED="true", MSWEA_SILENT_STARTUP="1", MSWEA_GLOBAL_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = subprocess.run(
        [str(mini), "-c", "mini.yaml", "-c", str(tmp_path / "env.yaml"), "-c", str(tmp_path / "model.yaml"),
         "-t", "fix hello.txt", "--yolo", "--exit-immediately", "-o", str(tmp_path / "traj.json")],
        capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    info = json.loads((tmp_path / "traj.json").read_text())["info"]
    assert info["exit_status"] == "Submitted" and info["submission"] == "hello\n"
    env_id = info["rollstack"]["environment_id"]
    with Client(adapter_node.url, token=adapter_node.token) as client:
        assert env_id not in [e.id for e in client.list() if e.state in ("creating", "running")]
