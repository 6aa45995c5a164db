"""`Node`: a node in this process (no server, no token), with the same interface as `Client`.

    with Node(store="oci:/tmp/store", root="/tmp/node") as node:
        with node.create("plan.yaml") as env:
            env.exec("make test")

It starts a `NodeService` (recovery, lazy store daemon, provisioner) and stops it on close,
destroying the environments it created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollstack.client.environment import EnvironmentFacade
from rollstack.node.config import NodeConfig


class Node(EnvironmentFacade):
    def __init__(self, store: str | None = None, root: str | Path | None = None, **config: Any) -> None:
        from rollstack.node.service import NodeService

        fields: dict[str, Any] = dict(config)
        if store is not None:
            fields["store"] = str(store)
        if root is not None:
            fields["root"] = Path(root).absolute()
        self.config = NodeConfig(**fields)
        self.service = NodeService(self.config)
        self._service = self.service
        self.service.start()

    def close(self) -> None:
        self.service.stop()
