"""`RollstackSandbox` against slime's sandbox protocol, structurally (slime itself is not
installable here: it needs GPUs, Megatron and sglang), plus its logic against fake clients.

The expected signatures are slime's `slime.agent.sandbox.Sandbox` Protocol as of THUDM/slime
624b824 (2026-08-21; `idempotent` was added to `exec` in fcbd428): parameter names, kinds and
defaults must match exactly, or slime's helpers calling by keyword would break."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from integrations_fakes import AsyncFakeClient, FakeClient
from rollstack.errors import CommandFailed, EnvironmentNotFound, InvalidRequest, NotFound
from rollstack.integrations.slime import RollstackSandbox, user_argv
from rollstack.contract.models import ExecResult

P = inspect.Parameter
KW, POS = P.KEYWORD_ONLY, P.POSITIONAL_OR_KEYWORD
E = P.empty

SLIME_PROTOCOL = {
    "exec": [("cmd", POS, E), ("user", KW, "root"), ("env", KW, None), ("timeout", KW, 120),
             ("check", KW, False), ("idempotent", KW, True)],
    "write_file": [("sandbox_path", POS, E), ("content", POS, E), ("user", KW, "root")],
    "read_file": [("sandbox_path", POS, E), ("user", KW, "root")],
    "__aexit__": [("exc_type", POS, E), ("exc", POS, E), ("tb", POS, E)],
    "__aenter__": [],
}


@pytest.mark.parametrize("name", sorted(SLIME_PROTOCOL))
def test_signatures_match_slimes_protocol(name: str) -> None:
    method = getattr(RollstackSandbox, name)
    assert inspect.iscoroutinefunction(method)
    params = list(inspect.signature(method).parameters.values())[1:]  # without self
    assert [(p.name, p.kind, p.default) for p in params] == SLIME_PROTOCOL[name]


def test_sandbox_id_attribute_and_constructor_shape() -> None:
    sb = RollstackSandbox("app:1")            # slime's boot code calls E2BSandbox(image)
    assert sb.sandbox_id == "" and isinstance(sb.sandbox_id, str)
    with pytest.raises(InvalidRequest):
        RollstackSandbox("")
    with pytest.raises(InvalidRequest):
        RollstackSandbox("p", shell=[])


def test_user_argv() -> None:
    assert user_argv("echo hi", "root", ["/bin/sh", "-c"]) == ["/bin/sh", "-c", "echo hi"]
    assert user_argv("echo hi", None, ["bash", "-lc"]) == ["bash", "-lc", "echo hi"]
    assert user_argv("id", "agent", ["/bin/bash", "-lc"]) == ["su", "agent", "-s", "/bin/bash", "-c", "id"]
    for bad in ("-root", "a b", "x;rm -rf /", "a" * 40, "$(id)"):
        with pytest.raises(InvalidRequest):
            user_argv("id", bad, ["/bin/sh", "-c"])


def handler(command, kwargs):
    script = command[-1]
    if script == "slow":
        return ExecResult(exit_code=124, stdout="partial", timed_out=True)
    if script.startswith("exit "):
        return ExecResult(exit_code=int(script[5:]), stdout="o", stderr="e" * 1000)
    return ExecResult(exit_code=0, stdout=f"ran {script}", stderr="")



def test_exec_results_check_and_timeout() -> None:
    inner = FakeClient(handler)

    async def go():
        async with RollstackSandbox("p", client=AsyncFakeClient(inner), cwd="/w") as sb:
            assert sb.sandbox_id == "env-1"
            assert await sb.exec("ls", env={"A": "1"}, timeout=5) == (0, "ran ls", "")
            assert inner.envs[0].execs[-1] == (["/bin/sh", "-c", "ls"], {"timeout": 5, "cwd": "/w", "env": {"A": "1"}})
            assert await sb.exec("exit 3") == (3, "o", "e" * 1000)
            with pytest.raises(CommandFailed) as failed:
                await sb.exec("exit 3", check=True)
            assert isinstance(failed.value, RuntimeError) and failed.value.details["exit_code"] == 3
            assert len(str(failed.value)) < 600                 # stderr head only, like slime's message
            assert await sb.exec("slow", timeout=1) == (124, "partial", "")
            await sb.exec("x", timeout=0)                       # 0: no timeout of its own
            assert inner.envs[0].execs[-1][1]["timeout"] is None
            await sb.write_file("/a", Path(__file__))
            await sb.write_file("/b", "t")
            assert inner.envs[0].files["/b"] == b"t" and inner.envs[0].files["/a"] == Path(__file__).read_bytes()
            with pytest.raises(InvalidRequest):
                await sb.write_file("/c", 42)  # type: ignore[arg-type]

    asyncio.run(go())
    assert inner.envs[0].destroyed == 1 and inner.closed is False   # a given client stays open


def test_read_file_missing_is_empty_but_other_errors_raise() -> None:
    inner = FakeClient(handler)

    async def go():
        async with RollstackSandbox("p", client=AsyncFakeClient(inner)) as sb:
            env = sb.environment
            errors = [NotFound("no such file: /x"), EnvironmentNotFound("gone")]

            async def read_file(path):
                raise errors.pop(0)

            env.read_file = read_file
            assert await sb.read_file("/x") == ""
            with pytest.raises(EnvironmentNotFound):
                await sb.read_file("/x")

    asyncio.run(go())


def test_not_started_and_failed_destroy() -> None:
    inner = FakeClient(handler)

    async def go():
        sb = RollstackSandbox("p", client=AsyncFakeClient(inner))
        with pytest.raises(InvalidRequest):
            await sb.exec("ls")
        async with sb:
            async def destroy():
                raise EnvironmentNotFound("already gone")

            sb.environment.destroy = destroy    # __aexit__ logs it and does not raise
        assert sb.environment is None

    asyncio.run(go())


def test_create_failure_closes_an_owned_client(monkeypatch) -> None:
    made: list[AsyncFakeClient] = []

    class Failing(AsyncFakeClient):
        async def create(self, plan):
            raise EnvironmentNotFound("boom")

    def factory(client, node, token):
        made.append(Failing())
        return made[-1], True

    monkeypatch.setattr("rollstack.integrations.slime.async_client", factory)

    async def go():
        async with RollstackSandbox("p"):
            pass

    with pytest.raises(EnvironmentNotFound):
        asyncio.run(go())
    assert made[0].inner.closed
