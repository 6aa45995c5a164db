"""The lazy store's *shifted view*: every layer once more, with owners moved into the node's
user-namespace range, for user-namespaced environments (rollstack.run.userns).

    /shifted/               the same directory as /layers, under other inode numbers
    /shifted/<digest-hex>/  the layer's tree: uid/gid u -> BASE + u (u >= SIZE -> 65534, the
                            overflow id: shows as `nobody` inside, like any unmapped owner)

Why: a FUSE mount cannot be idmapped unless the server sets FUSE_ALLOW_IDMAP (libfuse >= 3.16;
Debian's is 3.14), so the idmapped-lower trick of run/userns.py works only for local layers.
Overlayfs stacked on /shifted/<hex> shows the environment's mapped root (host BASE) its files
as owned by root, and copy-up carries the shifted owners into the upper.

The shifted view is one namespace inside the same FUSE mount, not a second daemon: inode
`SHIFT | i` is inode `i` seen shifted. Every request on a shifted inode is answered by the
unshifted code path with `i`, and only the attributes are rewritten afterwards
(`shift_attr`), so a shifted file can never expose different data, names, xattrs or link
targets than the unshifted one: there is no second lookup, read or listing implementation.
The kernel keeps separate attribute and page caches for the two inode numbers (a file read
through both views is cached twice). The range is per node (`BASE`, `SIZE`), shared by every
user-namespaced environment of the node.

This module is pure (paths, ids); the FUSE side is rollstack.lazystore.shiftfs.
"""

from __future__ import annotations

import errno
import os

BASE = 100000  # host uid/gid of root inside a user-namespaced environment
SIZE = 65536
OVERFLOW = 65534
SHIFT = 1 << 40  # inode bit of the shifted view (layer inodes start at 1000, far below)
NAME = "shifted"


def shifted_ids(uid: int, gid: int) -> tuple[int, int]:
    """Host ids of a layer's owner `uid`/`gid` in the shifted view."""
    return (BASE + uid if 0 <= uid < SIZE else OVERFLOW, BASE + gid if 0 <= gid < SIZE else OVERFLOW)


def shifted_path(layer_dir: os.PathLike[str] | str) -> str | None:
    """The shifted twin of a lazy-store layer directory `<mnt>/layers/<hex>`, or None when
    `layer_dir` is not one (a local, materialized layer: run/userns.py idmaps those)."""
    p = os.fspath(layer_dir).rstrip("/")
    parent, hexd = os.path.split(p)
    mnt, layers = os.path.split(parent)
    if layers != "layers" or not hexd:
        return None
    twin = os.path.join(mnt, NAME, hexd)
    try:
        same = os.stat(twin).st_dev == os.stat(p).st_dev
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    return twin if same else None
