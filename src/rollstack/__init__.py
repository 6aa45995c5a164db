"""rollstack: an environment manager for agentic RL (lazy seekable OCI layers, overlayfs, runc,
elastic quotas, a node agent with an HTTP API, this SDK and a CLI).

    from rollstack import Client, AsyncClient, Node, AsyncNode

Importing `rollstack` has no side effects; the names below are loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Client": "rollstack.client._clients",
    "AsyncClient": "rollstack.client._clients",
    "Environment": "rollstack.client._handles",
    "AsyncEnvironment": "rollstack.client._handles",
    "ExecResult": "rollstack.contract.models",
    "Evaluation": "rollstack.contract.models",
    "Node": "rollstack.client.local",
    "AsyncNode": "rollstack.client.local",
    "Pool": "rollstack.cluster.pool",
    "AsyncPool": "rollstack.cluster.pool",
}

__all__ = sorted([*_EXPORTS, "errors"])


def __getattr__(name: str) -> Any:
    import importlib

    if name == "errors":
        return importlib.import_module("rollstack.errors")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollstack' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
