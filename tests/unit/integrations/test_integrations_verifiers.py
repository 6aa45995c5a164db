"""`RollstackRuntime` (verifiers v1) logic against fake clients, and the registration facts the
docs state about verifiers' closed runtime union."""

from __future__ import annotations

import asyncio

import pytest
import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.errors import SandboxError
from verifiers.v1.runtimes import Runtime, make_runtime

from integrations_fakes import AsyncFakeClient, FakeClient
from rollstack.errors import EnvironmentGone, NotFound
from rollstack.integrations.verifiers import RollstackConfig, RollstackRuntime, evaluator_reward
from rollstack.contract.models import ExecResult


def started(handler=None) -> tuple[RollstackRuntime, FakeClient]:
    inner = FakeClient(handler or (lambda cmd, kw: ExecResult(exit_code=0, stdout="/w\n" if cmd == ["pwd"] else "ok")))
    box = RollstackRuntime(RollstackConfig(plan={"groups": ["os/busybox:1"]}))
    box.client = AsyncFakeClient(inner)
    box.environment = asyncio.run(box.client.create(box.config.plan))
    box.info.id = box.environment.id
    return box, inner


def test_config() -> None:
    cfg = RollstackConfig(plan="app:1", exec_timeout=3)
    assert cfg.type == "rollstack" and "token" not in repr(RollstackConfig(plan="p", token="secret"))
    for bad in ({}, {"plan": "p", "exec_timeout": 0}, {"plan": "p", "nope": 1}):
        with pytest.raises(ValidationError):
            RollstackConfig(**bad)
    assert issubclass(RollstackRuntime, Runtime) and RollstackRuntime.supports_user
    assert not RollstackRuntime(cfg).supports_live_processes


def test_the_runtime_union_is_closed() -> None:
    """What docs/integrations.md says: a rollstack runtime cannot be named in verifiers' config;
    if this starts failing, verifiers opened its union and the registration can move to config."""
    with pytest.raises(ValidationError):
        vf.AgentConfig(model="m", runtime={"type": "rollstack", "plan": "p"})
    with pytest.raises(KeyError):
        make_runtime(RollstackConfig(plan="p"))  # type: ignore[arg-type]


def test_run_argv_user_and_errors() -> None:
    box, inner = started()
    box.workdir = "/w"
    asyncio.run(box.run(["echo", "a b"], {"X": "1"}))
    argv, kwargs = inner.envs[0].execs[-1]
    assert argv == ["echo", "a b"] and kwargs["cwd"] == "/w" and kwargs["env"] == {"X": "1"}
    agent = box.with_user("agent", home="/home/h")
    asyncio.run(agent.run(["id", "-u"], {}))
    argv, kwargs = inner.envs[0].execs[-1]
    assert argv == ["su", "agent", "-s", "/bin/sh", "-c", "export HOME=/home/h; exec id -u"]
    assert kwargs["env"]["HOME"] == "/home/h"
    with pytest.raises(SandboxError):
        asyncio.run(box.run([], {}))

    async def gone(*a, **k):
        raise EnvironmentGone("oom")

    box.environment.exec = gone
    with pytest.raises(SandboxError, match="environment_gone"):
        asyncio.run(box.run(["true"], {}))


def test_read_errors_and_evaluator_reward() -> None:
    box, inner = started()
    box.workdir = "/w"

    async def missing(path):
        raise NotFound(f"no such file: {path}")

    box.environment.read_file = missing
    with pytest.raises(SandboxError, match="/w/x"):
        asyncio.run(box.read("x"))
    assert asyncio.run(evaluator_reward(box)) == 1.0
    with pytest.raises(SandboxError):
        asyncio.run(evaluator_reward(object()))


def test_teardown_is_idempotent_and_closes_the_client() -> None:
    box, inner = started()
    asyncio.run(box.stop())
    asyncio.run(box.stop())
    assert inner.envs[0].destroyed == 1 and inner.closed and box.environment is None
    box.cleanup()                                      # nothing left to do
    with pytest.raises(SandboxError):
        asyncio.run(box.run(["true"], {}))
