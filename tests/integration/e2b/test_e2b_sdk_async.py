"""The unmodified `e2b` SDK (async) against a real node: the same flows as the sync suite,
and several sandboxes driven concurrently from one event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

pytestmark = pytest.mark.integration

from e2b import (  # noqa: E402
    AsyncSandbox, CommandExitException, FileNotFoundException, SandboxNotFoundException, SandboxQuery,
)


def test_async_commands_files_timeout_list_kill(e2b_node):
    async def scenario() -> None:
        box = await AsyncSandbox.create(e2b_node.template, timeout=120, metadata={"suite": "async"})
        try:
            r = await box.commands.run("echo hi; cat /work/app/hello.txt")
            assert r.stdout == "hi\nbug\n"
            chunks: list[str] = []
            await box.commands.run("echo a; sleep 0.2; echo b", on_stdout=chunks.append)
            assert "".join(chunks) == "a\nb\n"
            with pytest.raises(CommandExitException) as info:
                await box.commands.run("echo nope >&2; exit 7")
            assert info.value.exit_code == 7 and info.value.stderr == "nope\n"

            bg = await box.commands.run("cat", background=True, stdin=True)
            assert bg.pid in {p.pid for p in await box.commands.list()}
            await box.commands.send_stdin(bg.pid, "piped\n")
            await box.commands.close_stdin(bg.pid)
            assert (await bg.wait()).stdout == "piped\n"

            sleeper = await box.commands.run("sleep 60", background=True)
            assert await sleeper.kill() is True
            with pytest.raises(CommandExitException):
                await sleeper.wait()

            await box.files.write("/work/async/x.txt", "xyz")
            assert await box.files.read("/work/async/x.txt") == "xyz"
            assert [e.name for e in await box.files.list("/work/async")] == ["x.txt"]
            await box.files.remove("/work/async/x.txt")
            with pytest.raises(FileNotFoundException):
                await box.files.read("/work/async/x.txt")

            listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"suite": "async"})).next_items()
            assert [s.sandbox_id for s in listed] == [box.sandbox_id]
            await box.set_timeout(60)
            info2 = await box.get_info()
            assert info2.end_at.timestamp() > time.time() + 50
        finally:
            assert await box.kill() is True
        assert not await box.is_running()
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.connect(box.sandbox_id)

    asyncio.run(scenario())


def test_async_many_sandboxes_concurrently(e2b_node):
    async def one(i: int) -> str:
        box = await AsyncSandbox.create(e2b_node.template, timeout=60)
        try:
            await box.files.write(f"/tmp/n{i}", str(i))
            r = await box.commands.run(f"cat /tmp/n{i}; ls /tmp")
            return r.stdout
        finally:
            await box.kill()

    async def scenario() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(4)))

    outs = asyncio.run(scenario())
    # each sandbox saw its own file only: `cat` prints "i" (no newline), `ls /tmp` prints "ni"
    assert outs == [f"{i}n{i}\n" for i in range(4)]


def test_async_many_commands_in_one_sandbox(e2b_node):
    async def scenario() -> list[str]:
        box = await AsyncSandbox.create(e2b_node.template, timeout=120)
        try:
            runs = [box.commands.run(f"for j in 1 2 3; do echo {i}-$j; sleep 0.1; done") for i in range(16)]
            return [r.stdout for r in await asyncio.gather(*runs)]
        finally:
            await box.kill()

    assert asyncio.run(scenario()) == [f"{i}-1\n{i}-2\n{i}-3\n" for i in range(16)]


def test_async_fork_pause_connect(e2b_node):
    async def scenario() -> None:
        box = await AsyncSandbox.create(e2b_node.template, timeout=120)
        kids: list = []
        try:
            await box.files.write("/work/app/state.txt", "cut")
            kids = await box.fork(count=2, timeout=60)
            assert all(isinstance(k, AsyncSandbox) for k in kids), kids
            assert [await k.files.read("/work/app/state.txt") for k in kids] == ["cut", "cut"]
            await box.pause()
            same = await AsyncSandbox.connect(box.sandbox_id)
            assert (await same.commands.run("cat /work/app/state.txt")).stdout == "cut"
        finally:
            for k in kids:
                if isinstance(k, AsyncSandbox):
                    await k.kill()
            await box.kill()

    asyncio.run(scenario())


def test_async_volumes_shared_by_sandboxes(e2b_node):
    from e2b import AsyncVolume

    async def scenario() -> None:
        vol = await AsyncVolume.create("async-vol")
        try:
            await vol.write_file("/in.txt", "shared\n")
            boxes = await asyncio.gather(*(AsyncSandbox.create(e2b_node.template, timeout=60,
                                                                volume_mounts={"/v": vol}) for _ in range(2)))
            try:
                await boxes[0].commands.run("echo from-0 > /v/zero.txt")
                assert (await boxes[1].commands.run("cat /v/in.txt /v/zero.txt")).stdout == "shared\nfrom-0\n"
            finally:
                await asyncio.gather(*(b.kill() for b in boxes))
            assert await vol.read_file("/zero.txt") == "from-0\n"
            assert {e.name for e in await vol.list("/")} == {"in.txt", "zero.txt"}
        finally:
            assert await AsyncVolume.destroy(vol.volume_id) is True

    asyncio.run(scenario())
