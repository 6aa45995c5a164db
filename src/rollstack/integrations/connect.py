"""Where an adapter's environments come from: a caller-given client (`Client`, in-process `Node`,
`AsyncClient`, or any object with `create(plan)`), or a `Client` built from a node URL and token.

URL and token default as everywhere else ($ROLLSTACK_NODE, $ROLLSTACK_TOKEN, then the token file
in the node's root: `rollstack.client._base`). A client built here is owned, and closed, by the
adapter; a caller-given one is left open.
"""

from __future__ import annotations

from typing import Any


def sync_client(client: Any = None, node: str | None = None, token: str | None = None) -> tuple[Any, bool]:
    """(client, owned): `client` as given, else a new `Client(node, token)` (owned)."""
    if client is not None:
        return client, False
    from rollstack.client._clients import Client

    return Client(node or None, token), True


def async_client(client: Any = None, node: str | None = None, token: str | None = None) -> tuple[Any, bool]:
    """(client, owned): `client` as given, else a new `AsyncClient(node, token)` (owned)."""
    if client is not None:
        return client, False
    from rollstack.client._clients import AsyncClient

    return AsyncClient(node or None, token), True
