"""slime's sandbox protocol (`RollstackSandbox`) on a real node over HTTP (AsyncClient): commands,
files, users, timeouts, detached commands polled through marker files (the pattern of slime's
`exec_and_wait`), the clean evaluator, and cleanup on every exit path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adapters_fixtures import FIX_HELLO, busybox_plan
from rollstack import AsyncClient
from rollstack.errors import CommandFailed
from rollstack.integrations.slime import RollstackSandbox

pytestmark = pytest.mark.integration


def run(coro):
    return asyncio.run(coro)


async def live_ids(node) -> set[str]:
    async with AsyncClient(node.url, node.token) as client:
        return {e.id for e in await client.list() if e.state != "destroying"}  # destroyed: being reclaimed


def test_exec_files_and_destroy(adapter_node, tmp_path: Path) -> None:
    host_file = tmp_path / "payload.bin"
    host_file.write_bytes(bytes(range(256)) * 4)

    async def go():
        async with RollstackSandbox(busybox_plan(), node=adapter_node.url, token=adapter_node.token) as sb:
            sid = sb.sandbox_id
            assert sid and sid in await live_ids(adapter_node)
            rc, out, err = await sb.exec("cat hello.txt; echo to-err >&2; echo $TASK $EXTRA", env={"EXTRA": "x1"})
            assert (rc, out, err) == (0, "bug\nhello x1\n", "to-err\n")  # the plan's mutation is applied; env merged
            rc, out, err = await sb.exec("echo partial; exit 3")
            assert (rc, out) == (3, "partial\n")
            with pytest.raises(CommandFailed) as failed:
                await sb.exec("echo nope >&2; exit 5", check=True)
            assert isinstance(failed.value, RuntimeError) and "exit=5" in str(failed.value) and "nope" in str(failed.value)
            rc, out, _ = await sb.exec("echo started; sleep 30", timeout=1)
            assert (rc, out) == (124, "started\n")
            with pytest.raises(CommandFailed):
                await sb.exec("sleep 30", timeout=1, check=True)

            await sb.write_file("/tmp/a/b.txt", "text ü\n")
            await sb.write_file("/tmp/raw.bin", b"\x00\x01")
            await sb.write_file("/tmp/host.bin", host_file)
            assert await sb.read_file("/tmp/a/b.txt") == "text ü\n"
            rc, out, _ = await sb.exec("wc -c < /tmp/raw.bin; cmp /tmp/host.bin /tmp/host.bin && wc -c < /tmp/host.bin")
            assert out.split() == ["2", "1024"]
            assert await sb.read_file("/tmp/does-not-exist") == ""
            return sid

    sid = run(go())
    assert sid not in run(live_ids(adapter_node))


def test_destroyed_when_the_body_raises(adapter_node) -> None:
    seen: list[str] = []

    async def go():
        async with AsyncClient(adapter_node.url, adapter_node.token) as client:
            async with RollstackSandbox(busybox_plan(), client=client) as sb:
                seen.append(sb.sandbox_id)
                raise KeyError("rollout bug")

    with pytest.raises(KeyError):
        run(go())
    assert seen and seen[0] not in run(live_ids(adapter_node))


def test_users_detached_commands_and_evaluator(adapter_node) -> None:
    async def go():
        async with AsyncClient(adapter_node.url, adapter_node.token) as client:
            async with RollstackSandbox(busybox_plan(), client=client) as sb:
                # a user, as slime's ensure_agent_user makes one (busybox: by editing passwd)
                await sb.exec("echo 'agent:x:1000:1000::/home/agent:/bin/sh' >> /etc/passwd && mkdir -p /home/agent"
                              " && chown 1000 /home/agent", check=True)
                rc, out, _ = await sb.exec("id -u; echo $MODE", user="agent", env={"MODE": "m"})
                assert (rc, out) == (0, "1000\nm\n")
                await sb.write_file("/home/agent/notes.txt", "mine\n", user="agent")
                _, owner, _ = await sb.exec("stat -c %u /home/agent/notes.txt")
                assert owner.strip() == "1000"
                rc, _, err = await sb.exec("echo x > /root/forbidden", user="agent")
                assert rc != 0 and err
                with pytest.raises(Exception):
                    await sb.exec("true", user="no such user!")

                # slime's exec_and_wait pattern: launcher file, setsid'd detached spawn, marker polls
                await sb.write_file("/tmp/.t.sh", "#!/bin/sh\ncd /work/app\nsleep 1\ncat hello.txt\nexit 7\n")
                rc, _, _ = await sb.exec("chmod +x /tmp/.t.sh; setsid sh -c '/tmp/.t.sh > /tmp/.t.out 2>&1;"
                                         " echo $? > /tmp/.t.done' < /dev/null > /dev/null 2>&1 &", timeout=30, check=True)
                assert rc == 0
                for _ in range(40):
                    rc, out, _ = await sb.exec("test -f /tmp/.t.done && cat /tmp/.t.done", timeout=15)
                    if rc == 0 and out.strip():
                        break
                    await asyncio.sleep(0.25)
                assert out.strip() == "7"
                assert await sb.read_file("/tmp/.t.out") == "bug\n"

                assert (await sb.evaluate()).reward == 0.0       # the bug is still there
                await sb.write_file("/tmp/fix.diff", FIX_HELLO)
                await sb.exec("patch -p1 < /tmp/fix.diff", check=True)
                assert (await sb.evaluate()).reward == 1.0
                d = await sb.diff()                               # from the plan's groups (before the bug)
                assert "b/home/agent/notes.txt" in d and "hello.txt" not in d

    run(go())


def test_concurrent_sandboxes_share_one_async_client(adapter_node) -> None:
    """slime runs many rollouts in one event loop: four sandboxes on one AsyncClient each block in
    an exec until the test, over the same client, has seen all four start and released them."""
    n = 4

    async def go():
        async with AsyncClient(adapter_node.url, adapter_node.token) as client:
            boxes = [RollstackSandbox(busybox_plan(), client=client) for _ in range(n)]
            await asyncio.gather(*(b.__aenter__() for b in boxes))
            try:
                wait = "echo up > /tmp/started; i=0; while [ ! -f /tmp/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/go"
                runs = [asyncio.create_task(b.exec(wait, timeout=60)) for b in boxes]
                for _ in range(200):
                    if all([await b.read_file("/tmp/started") == "up\n" for b in boxes]):
                        break
                    await asyncio.sleep(0.1)
                else:
                    pytest.fail("the four commands never ran at the same time")
                assert not any(r.done() for r in runs)             # all four execs are in flight
                await asyncio.gather(*(b.write_file("/tmp/go", f"go {i}\n") for i, b in enumerate(boxes)))
                results = await asyncio.gather(*runs)
                assert results == [(0, f"go {i}\n", "") for i in range(n)]
                return {b.sandbox_id for b in boxes}
            finally:
                await asyncio.gather(*(b.__aexit__(None, None, None) for b in boxes))

    ids = run(go())
    assert len(ids) == n and ids.isdisjoint(run(live_ids(adapter_node)))
