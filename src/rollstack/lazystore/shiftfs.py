"""`ShiftingLazyFS`: LazyFS plus the shifted view /shifted (rollstack.lazystore.shift explains it).

Only inode numbers are translated here: a request on shifted inode `SHIFT | i` is answered by
LazyFS's own code for `i`, and the attributes it returns get the shifted owners afterwards.
"""

from __future__ import annotations

from typing import Any, Callable

import pyfuse3

from rollstack.lazystore.fs import LAYERS, ROOT, LazyFS
from rollstack.lazystore.shift import NAME, SHIFT, shifted_ids

SHIFTED = SHIFT | LAYERS  # the /shifted directory


def shift_attr(a: pyfuse3.EntryAttributes) -> pyfuse3.EntryAttributes:
    """`a` (an unshifted layer inode's attributes) as the shifted view reports them."""
    if a.st_ino in (0, ROOT):  # a negative lookup, or `..` of /shifted
        return a
    a.st_ino |= SHIFT
    a.st_uid, a.st_gid = shifted_ids(a.st_uid, a.st_gid)
    return a


def _plain(ino: int) -> int:
    return ino & ~SHIFT


class ShiftingLazyFS(LazyFS):
    """LazyFS plus /shifted (see the module doc). Only inode numbers are translated here."""

    def no_xattr_hook(self) -> Callable[[list[tuple[int, int]], frozenset[int]], None] | None:
        hook = super().no_xattr_hook()
        if hook is None:
            return None

        def both(ranges: list[tuple[int, int]], inodes: frozenset[int]) -> None:
            """The C xattr fast path learns the shifted copies of the ranges too."""
            hook(list(ranges) + [(lo | SHIFT, hi | SHIFT) for lo, hi in ranges],
                 frozenset(inodes) | frozenset(i | SHIFT for i in inodes))

        return both

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        if ino & SHIFT:
            return shift_attr(super()._attr(_plain(ino)))
        return super()._attr(ino)

    def _moved(self, a: pyfuse3.EntryAttributes, plain: int) -> pyfuse3.EntryAttributes:
        """The lookup count the unshifted path recorded, moved to the shifted inode."""
        if a.st_ino != plain and plain:
            left = self.lookups.get(plain, 0) - 1
            if left > 0:
                self.lookups[plain] = left
            else:
                self.lookups.pop(plain, None)
            self.lookups[a.st_ino] = self.lookups.get(a.st_ino, 0) + 1
        return a

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        if parent_inode == ROOT and name == NAME.encode():
            return self._counted(self._attr(SHIFTED))
        if not parent_inode & SHIFT:
            return await super().lookup(parent_inode, name, ctx)
        a = await super().lookup(_plain(parent_inode), name, ctx)
        plain = a.st_ino
        return self._moved(shift_attr(a), plain)

    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return await super().readlink(_plain(inode), ctx)

    async def opendir(self, inode: int, ctx: Any) -> int:
        return await super().opendir(_plain(inode), ctx) | (inode & SHIFT)

    def _listing(self, fh: int) -> list[tuple[str, int]]:
        if fh & SHIFT:
            return [(n, i | SHIFT) for n, i in super()._listing(_plain(fh))]
        out = super()._listing(fh)
        return out + [(NAME, SHIFTED)] if fh == ROOT else out

    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return await super().open(_plain(inode), flags, ctx)

    async def read_unopened(self, inode: int, off: int, size: int, ctx: Any) -> bytes:
        return await super().read_unopened(_plain(inode), off, size, ctx)

    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        return await super().getxattr(_plain(inode), name, ctx)

    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return await super().listxattr(_plain(inode), ctx)


