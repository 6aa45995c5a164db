"""The agent exec on an event loop (`Environment.exec_async`, what the node's API awaits): many
commands at once on one loop, a cancelled caller, the thread fallbacks. The behaviour suites
(test_run_exec.py, test_run_agent.py) run on this path too, as exec_mode "agent-async"."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from proc_helpers import assert_tree_gone
from rollstack.errors import EnvironmentGone
from rollstack.run import agent

pytestmark = pytest.mark.integration


def test_commands_run_concurrently_on_one_loop_without_threads(make_env):
    env = make_env()
    offloaded: list[str] = []

    async def offload(fn):  # the fallback path must not be taken
        offloaded.append(repr(fn))
        return await asyncio.to_thread(fn)

    async def main() -> tuple[float, list[bytes], int]:
        threads = threading.active_count()
        t = time.monotonic()
        # each waits until all 16 have started: one after the other, the first would time out
        rs = await asyncio.gather(*(env.exec_async(
            f"touch /tmp/started.{i}; while [ $(ls /tmp/started.* | wc -l) -lt 16 ]; do sleep 0.05; done; "
            f"echo {i}", timeout=120, offload=offload) for i in range(16)))
        return time.monotonic() - t, [r.stdout for r in rs], threads

    _, outs, _ = asyncio.run(main())
    assert outs == [f"{i}\n".encode() for i in range(16)]
    assert offloaded == []


def test_a_cancelled_caller_ends_the_commands_tree(make_env):
    env = make_env()

    async def main() -> None:
        task = asyncio.create_task(env.exec_async("sleep 301 & sleep 300"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert_tree_gone(env, b"sleep 300", b"sleep 301")


def test_a_large_request_goes_through_a_thread_and_works(make_env):
    env = make_env()
    calls: list[int] = []

    async def offload(fn):
        calls.append(1)
        return await asyncio.to_thread(fn)

    big = "x" * 40000  # > agent._ASYNC_MAX_REQUEST
    r = asyncio.run(env.exec_async("echo ${#BIG}", env={"BIG": big}, offload=offload))
    assert r.stdout == b"40000\n" and calls == [1]


def test_a_full_backlog_is_busy_not_a_blocked_loop(make_env, monkeypatch):
    env = make_env()
    real = agent.AgentPump._connect

    def busy(self, blocking=True):
        if not blocking:
            raise agent.AgentBusy("backlog full (simulated)")
        return real(self, blocking)

    monkeypatch.setattr(agent.AgentPump, "_connect", busy)
    r = asyncio.run(env.exec_async(["echo", "via a thread"]))
    assert r.stdout == b"via a thread\n"


def test_stdin_and_timeout_on_the_loop(make_env):
    env = make_env()
    data = bytes(range(256)) * 4096  # 1 MiB: more than a pipe holds, written as it drains
    r = asyncio.run(env.exec_async(["cat"], stdin=data))
    assert r.exit_code == 0 and r.stdout == data
    t = time.monotonic()
    r = asyncio.run(env.exec_async("sleep 600", timeout=0.5))
    assert r.timed_out and time.monotonic() - t < 300  # ended by the timeout, not the sleep


def test_a_gone_environment_is_gone_on_the_loop(make_env, wait_stopped):
    env = make_env()
    env.destroy()
    with pytest.raises(EnvironmentGone):
        asyncio.run(env.exec_async("true"))
