"""A published plan wherever a plan is accepted: the CLI (`env create NAME:TAG`, `run NAME:TAG`),
the SDK (`client.create("NAME:TAG")`), both resolved by the node from its store."""

from __future__ import annotations

import json

import pytest

from rollstack import Client
from rollstack.cli.main import main

pytestmark = pytest.mark.integration


def test_cli_and_sdk_create_from_a_template(e2b_node, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here: the string names the template
    opts = ["--node", e2b_node.url, "--token", e2b_node.token]
    assert main(["env", "create", e2b_node.template, *opts, "--json"]) == 0
    env_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["env", "rm", env_id, *opts]) == 0
    capsys.readouterr()
    assert main(["run", e2b_node.template, *opts, "--", "cat", "hello.txt"]) == 0
    assert capsys.readouterr().out == "bug\n"  # the template's mutation, in its workdir
    code = main(["env", "create", "tasks/absent:1", *opts])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: template_not_found:")
    assert main(["plan", "resolve", e2b_node.template, "--store", e2b_node.store, "--no-cache", "--json"]) == 0
    stack = json.loads(capsys.readouterr().out)
    assert stack["plan"] == "app-task" and [x["group"] for x in stack["layers"]] == ["os/busybox:1", "repo/app:1"]
    with Client(e2b_node.url, token=e2b_node.token) as client, client.create(e2b_node.template) as env:
        assert env.exec("cat hello.txt").stdout == "bug\n"
        assert env.evaluate().reward == 0.0  # the published evaluator came along (the bug is not fixed)
