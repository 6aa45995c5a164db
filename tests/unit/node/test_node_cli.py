"""`rollstack env ...` and `rollstack run` end to end over real HTTP, against a fake service."""

from __future__ import annotations

import json

import pytest

from fake_node_service import FakeService
from rollstack.cli.main import main
from rollstack.node.api import create_app
from rollstack.node.server import BackgroundServer

TOKEN = "cli-token"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch, tmp_path):
    service = FakeService(max_environments=3)
    with BackgroundServer(create_app(service, TOKEN)) as server:
        monkeypatch.setenv("ROLLSTACK_NODE", server.url)
        monkeypatch.setenv("ROLLSTACK_TOKEN", TOKEN)
        yield service


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("name: cli\ngroups: [os/base:1]\n")
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_create_json_ls_rm(node: FakeService, plan_file, capsys) -> None:
    code, out, _ = run(capsys, "env", "create", str(plan_file), "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc["timings"]) >= {"resolve", "toc", "mount", "mutation", "start", "total"}
    code, out, _ = run(capsys, "env", "ls", "--json")
    assert [e["id"] for e in json.loads(out)["environments"]] == [doc["id"]]
    assert run(capsys, "env", "rm", doc["id"])[0] == 0
    assert json.loads(run(capsys, "env", "ls", "--json")[1]) == {"environments": []}


def test_exec_streams_and_exits_with_the_code(node: FakeService, plan_file, capsys) -> None:
    env_id = json.loads(run(capsys, "env", "create", str(plan_file), "--json")[1])["id"]
    code, out, err = run(capsys, "env", "exec", env_id, "--cwd", "/w", "--", "ls", "-la")
    assert code == 7  # the fake's result
    assert out == "ls\n-la\n" and "err" in err
    assert node.last_exec is not None and node.last_exec.cwd == "/w"


def test_run_creates_execs_destroys(node: FakeService, plan_file, capsys) -> None:
    code, out, _ = run(capsys, "run", str(plan_file), "--", "echo", "x")
    assert code == 7 and out == "echo\nx\n"
    assert node.envs == {}


def test_cp_both_ways(node: FakeService, plan_file, tmp_path, capsys) -> None:
    env_id = json.loads(run(capsys, "env", "create", str(plan_file), "--json")[1])["id"]
    src = tmp_path / "in.txt"
    src.write_bytes(b"payload")
    assert run(capsys, "env", "cp", str(src), f"{env_id}:/w/in.txt")[0] == 0
    dst = tmp_path / "out.txt"
    assert run(capsys, "env", "cp", f"{env_id}:/w/in.txt", str(dst))[0] == 0
    assert dst.read_bytes() == b"payload"
    code, _, err = run(capsys, "env", "cp", str(src), str(dst))
    assert code == 1 and err.startswith("error: invalid_request:")


def test_errors_are_one_line(node: FakeService, capsys) -> None:
    code, out, err = run(capsys, "env", "stats", "nope", "--json")
    assert code == 1 and out == ""
    assert err.strip() == "error: environment_not_found: no environment nope"


def test_wrong_token_and_no_node(node: FakeService, plan_file, monkeypatch, capsys) -> None:
    code, _, err = run(capsys, "env", "ls", "--token", "bad")
    assert code == 1 and err.startswith("error: unauthorized:")
    code, _, err = run(capsys, "env", "ls", "--node", "http://127.0.0.1:1")
    assert code == 1 and err.startswith("error: node_unavailable:")


def test_evaluate_diff_stats(node: FakeService, plan_file, capsys) -> None:
    env_id = json.loads(run(capsys, "env", "create", str(plan_file), "--json")[1])["id"]
    assert json.loads(run(capsys, "env", "evaluate", env_id, "--json")[1])["reward"] == 1.0
    assert json.loads(run(capsys, "env", "stats", env_id, "--json")[1])["history"][0]["cpu_limit"] == 0.5
    assert run(capsys, "env", "diff", env_id) == (0, "", "")


def test_fork(node: FakeService, plan_file, capsys) -> None:
    env_id = json.loads(run(capsys, "env", "create", str(plan_file), "--json")[1])["id"]
    code, out, _ = run(capsys, "env", "fork", env_id, "--count", "2", "--json")
    assert code == 0
    kids = [d["id"] for d in json.loads(out)]
    assert len(set(kids)) == 2 and env_id not in kids and set(kids) <= set(node.envs)
    code, _, err = run(capsys, "env", "fork", "nope")
    assert code != 0 and "environment_not_found" in err


def test_pause_resume(node: FakeService, plan_file, capsys) -> None:
    env_id = json.loads(run(capsys, "env", "create", str(plan_file), "--json")[1])["id"]
    code, out, _ = run(capsys, "env", "pause", env_id)
    assert code == 0 and out.split() == [env_id, "paused"] and node.pause_modes[env_id] == "freeze"
    code, out, _ = run(capsys, "env", "resume", env_id, "--json")
    assert code == 0 and json.loads(out)["state"] == "running"
    code, out, _ = run(capsys, "env", "pause", env_id, "--checkpoint")
    assert code == 0 and node.pause_modes[env_id] == "checkpoint"
