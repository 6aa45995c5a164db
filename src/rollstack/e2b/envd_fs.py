"""envd's `filesystem.Filesystem` service (Connect protocol) over the sandbox's root.

Operations go through the node's `tree` (rollstack.run.fsops.TreeRoot) on the host side of the environment's
merged root, never through a command in the sandbox (no image assumptions), and never follow a
symlink out of it (see rollstack.run.files). Served by the generated `FilesystemASGIApplication`
from the `e2b` wheel, like the process service. Supported: Stat, ListDir (with depth), MakeDir,
Move, Remove. Not supported: directory watches (WatchDir, CreateWatcher, ...: UNIMPLEMENTED).

Paths: absolute inside the sandbox; a relative path is taken from `/` (E2B resolves it from the
user's home directory, which rollstack's plans do not define).
"""

from __future__ import annotations

import stat as statmod
from typing import Any, AsyncIterator

from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from e2b.envd.filesystem import filesystem_pb as pb
from rollstack.e2b.rpc import Envd, unimplemented
from rollstack.contract.files import Entry

_TYPES = {"file": pb.FileType.FILE, "dir": pb.FileType.DIRECTORY, "symlink": pb.FileType.SYMLINK}


def entry_info(e: Entry) -> pb.EntryInfo:
    extra: dict[str, Any] = {}
    if e.target is not None:
        extra["symlink_target"] = e.target
    return pb.EntryInfo(
        name=e.name, type=_TYPES.get(e.kind, pb.FileType.UNSPECIFIED), path=e.path, size=e.size,
        mode=statmod.S_IMODE(e.mode), permissions=statmod.filemode(e.mode),
        owner="root" if e.uid == 0 else str(e.uid), group="root" if e.gid == 0 else str(e.gid),
        modified_time=Timestamp.from_nanos(int(e.mtime * 1e9)), is_symlink=e.kind == "symlink", **extra,
    )


class FilesystemService(Envd):
    async def _on_root(self, ctx: Any, op: str, *args: Any) -> Any:
        async with self.call(ctx) as box:
            return await self.run(self.service.tree, box.id, op, *args)

    async def stat(self, request: pb.StatRequest, ctx: Any) -> pb.StatResponse:
        return pb.StatResponse(entry=entry_info(await self._on_root(ctx, "entry", request.path)))

    async def list_dir(self, request: pb.ListDirRequest, ctx: Any) -> pb.ListDirResponse:
        entries = await self._on_root(ctx, "walk", request.path, max(1, int(request.depth or 1)))
        return pb.ListDirResponse(entries=[entry_info(e) for e in entries])

    async def make_dir(self, request: pb.MakeDirRequest, ctx: Any) -> pb.MakeDirResponse:
        return pb.MakeDirResponse(entry=entry_info(await self._on_root(ctx, "make_dir", request.path)))

    async def move(self, request: pb.MoveRequest, ctx: Any) -> pb.MoveResponse:
        entry = await self._on_root(ctx, "move", request.source, request.destination)
        return pb.MoveResponse(entry=entry_info(entry))

    async def remove(self, request: pb.RemoveRequest, ctx: Any) -> pb.RemoveResponse:
        await self._on_root(ctx, "remove", request.path)
        return pb.RemoveResponse()

    def watch_dir(self, request: pb.WatchDirRequest, ctx: Any) -> AsyncIterator[pb.WatchDirResponse]:
        return self.stream(ctx, _refuse())

    async def create_watcher(self, request: pb.CreateWatcherRequest, ctx: Any) -> pb.CreateWatcherResponse:
        raise unimplemented("directory watches are not supported by rollstack's envd")

    async def get_watcher_events(self, request: pb.GetWatcherEventsRequest, ctx: Any) -> pb.GetWatcherEventsResponse:
        raise unimplemented("directory watches are not supported by rollstack's envd")

    async def remove_watcher(self, request: pb.RemoveWatcherRequest, ctx: Any) -> pb.RemoveWatcherResponse:
        raise unimplemented("directory watches are not supported by rollstack's envd")


async def _refuse() -> AsyncIterator[pb.WatchDirResponse]:
    raise unimplemented("directory watches are not supported by rollstack's envd")
    yield  # pragma: no cover - makes this an async generator
