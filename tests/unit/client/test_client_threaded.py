"""`ThreadedService`: a blocking service's calls awaited through worker threads (what `AsyncNode`
runs on), with the async handles and facade over it; tested on the fake node service."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from fake_node_service import FakeService  # noqa: E402

from rollstack.client._clients import AsyncEnvironmentFacade  # noqa: E402
from rollstack.client._transports import ThreadedService  # noqa: E402
from rollstack.errors import EnvironmentNotFound  # noqa: E402


class Facade(AsyncEnvironmentFacade):
    def __init__(self, service: FakeService) -> None:
        self._service = ThreadedService(service)


def test_async_handles_over_a_threaded_service() -> None:
    fake = FakeService(max_environments=8)

    async def main() -> None:
        async with Facade(fake) as node:
            async with await node.create({"name": "p", "groups": ["g:1"]}) as env:
                r = await env.exec(["echo", "hi"], stdin="in")
                assert r.exit_code == 0 and r.stdout == "echo hi\nin"
                await env.write_file("/a", "x")
                assert await env.read_file("/a") == b"x"
                chunks = [c async for c in env.exec_stream(["echo", "s"])]
                assert chunks[-1].type == "result"
                assert [e.id for e in await node.list()] == [env.id]
            group = await node.create({"name": "p", "groups": ["g:1"]}, 3)
            assert len({e.id for e in group}) == 3
            for e in group:
                await e.destroy()
            try:
                await node.get("nope")
            except EnvironmentNotFound:
                pass
            else:
                raise AssertionError("get of an unknown id must raise")
        assert fake.envs == {}

    asyncio.run(main())
