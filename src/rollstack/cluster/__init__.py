"""rollstack's cluster layer: many node agents as one pool (see docs/cluster.md).

Kept import-light: `rollstack.cluster.placement` is pure and never imports Ray.
"""

from typing import Any


def up(address: str | None, store: str, **kwargs: Any) -> dict[str, Any]:
    """Start a node agent on every Ray node with the `rollstack` resource (see cluster.control)."""
    from rollstack.cluster.control import up as _up

    return _up(address, store, **kwargs)


def down(address: str | None) -> dict[str, Any]:
    """Stop every node agent of the cluster; nothing is left behind."""
    from rollstack.cluster.control import down as _down

    return _down(address)


def status(address: str | None) -> dict[str, Any]:
    from rollstack.cluster.control import status as _status

    return _status(address)
