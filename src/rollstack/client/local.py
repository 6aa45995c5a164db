"""`Node` and `AsyncNode`: a node in this process (no server, no token), with the interface of
`Client` and `AsyncClient`.

    with Node(store="oci:/tmp/store", root="/tmp/node") as node:
        with node.create("plan.yaml") as env:
            env.exec("make test")

    async with AsyncNode(store="oci:/tmp/store", root="/tmp/node") as node:
        async with await node.create("plan.yaml") as env:
            await env.exec("make test")

Each starts a `NodeService` (recovery, lazy store daemon, provisioner) and stops it on close,
destroying the environments it created. `AsyncNode` runs the blocking service's calls in worker
threads (`client._transports.ThreadedService`); it starts and stops the node in one as well.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollstack.client._clients import AsyncEnvironmentFacade, EnvironmentFacade
from rollstack.client._transports import ThreadedService
from rollstack.node.config import NodeConfig


def _service(store: str | None, root: str | Path | None, config: dict[str, Any]) -> Any:
    from rollstack.node.service import NodeService

    fields: dict[str, Any] = dict(config)
    if store is not None:
        fields["store"] = str(store)
    if root is not None:
        fields["root"] = Path(root).absolute()
    return NodeService(NodeConfig(**fields))


class Node(EnvironmentFacade):
    def __init__(self, store: str | None = None, root: str | Path | None = None, **config: Any) -> None:
        self.service = _service(store, root, config)
        self.config = self.service.config
        self._service = self.service
        self.service.start()

    def close(self) -> None:
        self.service.stop()


class AsyncNode(AsyncEnvironmentFacade):
    """Construct it, then `await node.start()` (or `async with AsyncNode(...) as node`)."""

    def __init__(self, store: str | None = None, root: str | Path | None = None, **config: Any) -> None:
        self.service = _service(store, root, config)
        self.config = self.service.config
        self._service = ThreadedService(self.service)
        self._started = False

    async def start(self) -> "AsyncNode":
        if not self._started:
            await asyncio.to_thread(self.service.start)
            self._started = True
        return self

    async def __aenter__(self) -> "AsyncNode":
        return await self.start()

    async def aclose(self) -> None:
        if self._started:
            self._started = False
            await asyncio.to_thread(self.service.stop)
