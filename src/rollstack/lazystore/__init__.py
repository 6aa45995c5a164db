"""The node-wide lazy layer store: one FUSE daemon exposing every layer as an overlay-ready
directory `<mountpoint>/layers/<digest-hex>/` (docs/lazy-store.md).

`LazyStoreClient` (client.py) is what the node agent uses; the daemon itself is
`python -m rollstack.lazystore.daemon` (daemon.py) around `LazyStoreService` (service.py) and the
pyfuse3 operations `LazyFS` (fs.py). Importing this package imports nothing (the client is
loaded on first use): `python -m rollstack.lazystore.holder`, the fd-holder, stays a small process
that starts and exits fast.
"""

from typing import Any

__all__ = ["LazyStoreClient"]


def __getattr__(name: str) -> Any:
    if name == "LazyStoreClient":
        from rollstack.lazystore.client import LazyStoreClient

        return LazyStoreClient
    raise AttributeError(name)
