"""The node-wide lazy layer store: one FUSE daemon exposing every layer as an overlay-ready
directory `<mountpoint>/layers/<digest-hex>/` (docs/lazy-store.md).

`LazyStoreClient` (client.py) is what the node agent uses; the daemon itself is
`python -m rollstack.mount.daemon` (daemon.py) around `LazyStoreService` (service.py) and the
pyfuse3 operations `LazyFS` (fs.py). Importing this package does not import pyfuse3.
"""

from rollstack.mount.client import LazyStoreClient

__all__ = ["LazyStoreClient"]
