"""The rollstack SDK: `Client` / `AsyncClient` over a node agent's HTTP API, and the handles they
return (`Environment` / `AsyncEnvironment`). `Node` / `AsyncNode` (in-process, no server) have
the same interfaces. Layout, as httpx keeps it: `_clients.py` (the clients side by side, on one
facade each), `_handles.py` (the handles side by side), `_transports.py` (the HTTP services side
by side, and the threaded face of an in-process service), `routes.py` (every call, once),
`_base.py` (settings, plan encoding, errors), `leases.py`, `local.py`.

Public names are re-exported lazily so that `import rollstack.client` stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Client": "rollstack.client._clients",
    "AsyncClient": "rollstack.client._clients",
    "AsyncEnvironment": "rollstack.client._handles",
    "Environment": "rollstack.client._handles",
    "Node": "rollstack.client.local",
    "AsyncNode": "rollstack.client.local",
    "ExecResult": "rollstack.contract.models",
    "ExecChunk": "rollstack.contract.models",
    "Evaluation": "rollstack.contract.models",
    "Stats": "rollstack.contract.models",
    "EnvironmentInfo": "rollstack.contract.models",
    "CreateResponse": "rollstack.contract.models",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollstack.client' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
