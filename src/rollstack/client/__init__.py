"""The rollstack SDK: `Client` / `AsyncClient` over a node agent's HTTP API, and the handles they
return. `rollstack.Node` (in-process, no server) has the same interface as `Client`.

Public names are re-exported lazily so that `import rollstack.client` stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Client": "rollstack.client.sync",
    "AsyncClient": "rollstack.client.aio",
    "AsyncEnvironment": "rollstack.client.aio",
    "Environment": "rollstack.client.environment",
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
