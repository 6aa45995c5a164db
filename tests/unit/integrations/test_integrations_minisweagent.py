"""The mini-swe-agent environment against fakes and against the real SDK over httpx.MockTransport."""

from __future__ import annotations

import json
import os

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

import httpx
import pytest
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

from integrations_fakes import FakeClient
from rollstack import Client
from rollstack.errors import NodeUnavailable, OomTerminated, PlanInvalid
from rollstack.integrations.episode import MERGE_PREFIX
from rollstack.integrations.minisweagent import RollstackEnvironment
from rollstack.contract.models import ExecResult

PLAN = {"name": "t", "groups": ["os/busybox:1"], "workdir": "/work/app"}
M = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_execute_merges_output_and_passes_settings() -> None:
    client = FakeClient(lambda cmd, kw: ExecResult(exit_code=3, stdout="out\n", stderr="err\n"))
    env = RollstackEnvironment(plan=PLAN, client=client, cwd="/work", env={"A": "1"}, timeout=7)
    out = env.execute({"command": "make"})
    assert out == {"output": "out\nerr\n", "returncode": 3, "exception_info": ""}
    command, kwargs = client.envs[0].execs[0]
    assert command == MERGE_PREFIX + "make"
    assert kwargs == {"timeout": 7, "cwd": "/work", "env": {"A": "1"}}
    env.execute({"command": "ls"}, cwd="/tmp", timeout=3)
    assert client.envs[0].execs[1][1]["cwd"] == "/tmp" and client.envs[0].execs[1][1]["timeout"] == 3
    env.cleanup()
    env.cleanup()  # idempotent
    assert client.envs[0].destroyed == 1 and not client.closed  # a caller's client stays open


def test_forward_env_and_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FWD", "host")
    monkeypatch.delenv("MISSING", raising=False)
    client = FakeClient()
    env = RollstackEnvironment(plan=PLAN, client=client, forward_env=["FWD", "MISSING"], env={"X": "1"},
                               interpreter=["bash", "-lc"], merge_stderr=False)
    env.execute({"command": "true"})
    command, kwargs = client.envs[0].execs[0]
    assert command == ["bash", "-lc", "true"]
    assert kwargs["env"] == {"FWD": "host", "X": "1"}


def test_submitted_like_docker() -> None:
    client = FakeClient(lambda cmd, kw: ExecResult(exit_code=0, stdout=f"{M}\ndiff --git a/x b/x\n"))
    env = RollstackEnvironment(plan=PLAN, client=client)
    with pytest.raises(Submitted) as info:
        env.execute({"command": f"echo {M}; git diff"})
    msg = info.value.messages[0]
    assert msg == {"role": "exit", "content": "diff --git a/x b/x\n",
                   "extra": {"exit_status": "Submitted", "submission": "diff --git a/x b/x\n"}}
    failing = FakeClient(lambda cmd, kw: ExecResult(exit_code=1, stdout=f"{M}\n"))
    assert RollstackEnvironment(plan=PLAN, client=failing).execute({"command": "x"})["returncode"] == 1


def test_timeout_matches_subprocess_timeout_expired() -> None:
    client = FakeClient(lambda cmd, kw: ExecResult(exit_code=137, stdout="partial\n", timed_out=True))
    env = RollstackEnvironment(plan=PLAN, client=client, timeout=5)
    out = env.execute({"command": "sleep 100"})
    assert out["returncode"] == -1 and out["output"] == "partial\n"
    assert out["exception_info"] == (
        "An error occurred while executing the command: Command 'sleep 100' timed out after 5 seconds")
    assert out["extra"]["exception_type"] == "TimeoutExpired"


def test_errors_returned_or_raised() -> None:
    client = FakeClient()
    env = RollstackEnvironment(plan=PLAN, client=client)

    def unavailable(_env):
        raise NodeUnavailable("node down")

    client.exec_hook = unavailable
    out = env.execute({"command": "ls"})
    assert out["returncode"] == -1 and "node down" in out["exception_info"]
    assert out["extra"] == {"exception_type": "NodeUnavailable", "exception": "node down", "code": "node_unavailable"}

    def oom(_env):
        raise OomTerminated("killed")

    client.exec_hook = oom
    with pytest.raises(OomTerminated):
        env.execute({"command": "ls"})
    relaxed = RollstackEnvironment(plan=PLAN, client=client, fatal_errors=[])
    assert relaxed.execute({"command": "ls"})["extra"]["code"] == "oom_terminated"


def test_lazy_creation_and_create_failure() -> None:
    client = FakeClient()
    env = RollstackEnvironment(plan=PLAN, client=client, lazy=True)
    assert client.envs == [] and env.environment_id is None
    env.execute({"command": "ls"})
    assert env.environment_id == "env-1"
    client.create_errors.append(PlanInvalid("bad plan"))
    with pytest.raises(PlanInvalid):
        RollstackEnvironment(plan=PLAN, client=client)


def test_template_vars_and_serialize_hide_the_token() -> None:
    env = RollstackEnvironment(plan=PLAN, client=FakeClient(), token="s3cret", timeout=9)
    tv = env.get_template_vars(extra=1)
    assert tv["timeout"] == 9 and tv["environment_id"] == "env-1" and tv["extra"] == 1
    assert "system" in tv and "machine" in tv
    ser = env.serialize()
    assert ser["info"]["config"]["environment_type"] == "rollstack.integrations.minisweagent.RollstackEnvironment"
    assert ser["info"]["config"]["environment"]["plan"] == PLAN
    assert ser["info"]["rollstack"]["environment_id"] == "env-1"
    assert ser["info"]["rollstack"]["timings"]["total"] == 0.25
    assert "s3cret" not in json.dumps(ser) and "s3cret" not in json.dumps(tv, default=str)


def test_loadable_by_dotted_path() -> None:
    client = FakeClient()
    env = get_environment({"environment_class": "rollstack.integrations.minisweagent.RollstackEnvironment",
                           "plan": PLAN, "client": client})
    assert isinstance(env, RollstackEnvironment) and env.environment_id == "env-1"


def test_default_agent_runs_to_submission_over_mock_transport() -> None:
    """mini-swe-agent's own agent and model, the real SDK Client, an HTTP fake of the node."""
    state = {"files": {}, "deleted": [], "requests": []}

    def handler(request: httpx.Request) -> httpx.Response:
        state["requests"].append(request)
        assert request.headers["authorization"] == "Bearer tok"
        if request.method == "POST" and request.url.path == "/v1/environments":
            assert json.loads(request.content)["plan"]["name"] == "t"
            return httpx.Response(200, json={"id": "e1", "timings": {"total": 0.1}})
        if request.url.path == "/v1/environments/e1/exec":
            body = json.loads(request.content)
            cmd = body["command"].removeprefix(MERGE_PREFIX)
            if cmd.startswith("echo "):
                return httpx.Response(200, json={"exit_code": 0, "stdout": cmd[5:] + "\n"})
            return httpx.Response(200, json={"exit_code": 1, "stdout": "", "stderr": f"{cmd}: not found\n"})
        if request.method == "DELETE":
            state["deleted"].append(request.url.path)
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": request.url.path}})

    client = Client("http://node.test", token="tok", transport=httpx.MockTransport(handler))
    env = RollstackEnvironment(plan=PLAN, client=client)
    model = DeterministicModel(outputs=[
        make_output("look", [{"command": "frobnicate"}]),
        make_output("done", [{"command": f"echo {M}"}]),
    ])
    agent = DefaultAgent(model, env, system_template="sys", instance_template="{{task}}", step_limit=5)
    result = agent.run("fix it")
    env.cleanup()
    assert result["exit_status"] == "Submitted"
    assert "frobnicate: not found" in agent.messages[3]["content"]
    assert state["deleted"] == ["/v1/environments/e1"]
