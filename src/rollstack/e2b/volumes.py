"""E2B volumes over the node's volumes (rollstack.node.volumes, docs/e2b.md#volumes).

The control plane: `POST/GET /volumes`, `GET/DELETE /volumes/{id}`; the volume content API
(`E2B_VOLUME_API_URL`: the node's URL too): `/volumecontent/{id}/{dir,path,file}`. A volume's
id is its name (names are unique on a node), its token the node's API token (the content API
takes `Authorization: Bearer` like the control plane). Paths are the volume's own, `/` its top.
Files are read and written whole, up to the node's file limit; parent directories are made.
"""

from __future__ import annotations

import json
import stat as statmod
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from rollstack.contract.files import Entry, normalized as _abs
from rollstack.contract.service import NodeLocal
from rollstack.core.bodies import read_capped
from rollstack.e2b.models import NewVolume
from rollstack.errors import AlreadyExists, InvalidRequest, NotFound

_KINDS = {"file": "file", "dir": "directory", "symlink": "symlink"}
_IDS = {"ge": 0, "le": 65535}


def entry_stat(e: Entry) -> dict[str, Any]:
    """A volume entry as E2B's `VolumeEntryStat` (rollstack keeps one time: mtime for all three)."""
    t = datetime.fromtimestamp(e.mtime, timezone.utc).isoformat()
    out: dict[str, Any] = {"name": e.name or "/", "type": _KINDS.get(e.kind, "unknown"), "path": e.path,
                           "size": e.size, "mode": statmod.S_IMODE(e.mode), "uid": e.uid, "gid": e.gid,
                           "atime": t, "mtime": t, "ctime": t}
    if e.target is not None:
        out["target"] = e.target
    return out


def add_volume_routes(app: FastAPI, service: NodeLocal, token: str | None, auth: list[Any],
                      call: Callable[..., Awaitable[Any]], max_file: int) -> None:
    def volume(v: Any) -> dict[str, Any]:
        return {"volumeID": v.name, "name": v.name, "token": token or "rollstack"}

    async def find(volume_id: str) -> Any:
        for v in await call(service.volumes):
            if v.name == volume_id:
                return v
        raise NotFound(f"volume {volume_id!r} was not found")

    @app.post("/volumes", dependencies=auth, status_code=201)
    async def create_volume(req: NewVolume) -> JSONResponse:
        return JSONResponse(volume(await call(service.create_volume, req.name)), status_code=201)

    @app.get("/volumes", dependencies=auth)
    async def list_volumes() -> JSONResponse:
        return JSONResponse([{"volumeID": v.name, "name": v.name} for v in await call(service.volumes)])

    @app.get("/volumes/{volume_id}", dependencies=auth)
    async def get_volume(volume_id: str) -> JSONResponse:
        return JSONResponse(volume(await find(volume_id)))

    @app.delete("/volumes/{volume_id}", dependencies=auth, status_code=204)
    async def delete_volume(volume_id: str) -> Response:
        await call(service.delete_volume, volume_id)
        return Response(status_code=204)

    def tree(volume_id: str, op: str, *args: Any) -> Awaitable[Any]:
        return call(service.volume_tree, volume_id, op, *args)

    async def with_attrs(volume_id: str, path: str, uid: int | None, gid: int | None, mode: int | None) -> Entry:
        if uid is None and gid is None and mode is None:
            return await tree(volume_id, "entry", path)
        return await tree(volume_id, "set_attrs", path, uid, gid, mode)

    @app.get("/volumecontent/{volume_id}/dir", dependencies=auth)
    async def list_dir(volume_id: str, path: str = Query("/"), depth: int = Query(1, ge=1, le=64)) -> JSONResponse:
        return JSONResponse([entry_stat(e) for e in await tree(volume_id, "walk", _abs(path), depth)])

    @app.post("/volumecontent/{volume_id}/dir", dependencies=auth, status_code=201)
    async def make_dir(volume_id: str, path: str = Query(..., min_length=1), uid: int | None = Query(None, **_IDS),
                       gid: int | None = Query(None, **_IDS), mode: int | None = Query(None, ge=0, le=0o7777),
                       force: bool = Query(False)) -> JSONResponse:
        """Parents are always made; an existing directory is 409 unless `force`."""
        try:
            await tree(volume_id, "make_dir", _abs(path), 0o755 if mode is None else mode)
        except AlreadyExists:
            if not force:
                raise
        return JSONResponse(entry_stat(await with_attrs(volume_id, _abs(path), uid, gid, None)), status_code=201)

    @app.get("/volumecontent/{volume_id}/path", dependencies=auth)
    async def stat_path(volume_id: str, path: str = Query(..., min_length=1)) -> JSONResponse:
        return JSONResponse(entry_stat(await tree(volume_id, "entry", _abs(path))))

    @app.patch("/volumecontent/{volume_id}/path", dependencies=auth)
    async def update_path(volume_id: str, request: Request, path: str = Query(..., min_length=1)) -> JSONResponse:
        raw = await read_capped(request, 1 << 16)
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise InvalidRequest("the body is not JSON") from None
        if not isinstance(body, dict) or set(body) - {"uid", "gid", "mode"}:
            raise InvalidRequest("the body takes uid, gid and mode only")
        for k, v in body.items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise InvalidRequest(f"{k} must be an integer")
        return JSONResponse(entry_stat(await with_attrs(volume_id, _abs(path), body.get("uid"), body.get("gid"),
                                                        body.get("mode"))))

    @app.delete("/volumecontent/{volume_id}/path", dependencies=auth, status_code=204)
    async def remove_path(volume_id: str, path: str = Query(..., min_length=1)) -> Response:
        await tree(volume_id, "remove", _abs(path))
        return Response(status_code=204)

    @app.get("/volumecontent/{volume_id}/file", dependencies=auth, response_class=Response)
    async def read_file(volume_id: str, path: str = Query(..., min_length=1)) -> Response:
        data = await call(service.read_volume_file, volume_id, _abs(path))
        return Response(data, media_type="application/octet-stream")

    @app.put("/volumecontent/{volume_id}/file", dependencies=auth, status_code=201)
    async def write_file(volume_id: str, request: Request, path: str = Query(..., min_length=1),
                         uid: int | None = Query(None, **_IDS), gid: int | None = Query(None, **_IDS),
                         mode: int | None = Query(None, ge=0, le=0o7777), force: bool = Query(True)) -> JSONResponse:
        """An existing file is replaced (the SDK's default); with `force=false` it is 409."""
        target = _abs(path)
        data = await read_capped(request, max_file)
        if not force:
            try:
                await tree(volume_id, "entry", target)
            except NotFound:
                pass
            else:
                raise AlreadyExists(f"{target} exists")
        await call(service.write_volume_file, volume_id, target, data)
        return JSONResponse(entry_stat(await with_attrs(volume_id, target, uid, gid, mode)), status_code=201)
