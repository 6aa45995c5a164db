"""Serving the E2B-compatible API beside the node's `/v1`: one ASGI dispatcher on the node app.

Requests go by path:
- `/process.Process/*`, `/filesystem.Filesystem/*`: envd's Connect services (connectrpc ASGI
  apps generated into the `e2b` wheel, with our handlers);
- `/files`, `/health`: envd's HTTP routes, and `/sandboxes...`, `/v2/sandboxes...`,
  `/snapshots`, `/templates/...` (snapshot deletes), `/volumes...` and `/volumecontent/...`
  (rollstack.e2b.volumes): the control plane (all in
  rollstack.e2b.control's FastAPI app);
- everything else: the node's own app, untouched.

envd requests (all of the first two kinds) name their sandbox with `E2b-Sandbox-Id`, so one
`E2B_SANDBOX_URL` (the node's URL) serves every sandbox. Before any envd handler runs, the
dispatcher answers like E2B's edge proxy: an unknown sandbox id (never created here, killed,
expired, or another node's) is `502 {"code": 502, "message": "... was not found"}` (the SDK
raises SandboxNotRunningException), a missing or wrong `X-Access-Token` is 401 (the SDK's
AuthenticationException). Request messages are capped (`max_message`, RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio.to_thread

from rollstack.e2b.control import create_control_app
from rollstack.e2b.envd_fs import FilesystemService
from rollstack.e2b.envd_process import ProcessService
from rollstack.e2b.rpc import SANDBOX_HEADER, TOKEN_HEADER, codecs
from rollstack.e2b.sandboxes import SandboxTable
from rollstack.errors import EnvironmentPaused, SandboxNotFound
from rollstack.contract.service import NodeLocal

log = logging.getLogger(__name__)

MAX_MESSAGE = 8 * 1024 * 1024
"""Largest Connect request message (envd's stdin chunks and paths are small)."""
_CONNECT_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
_ENVD_HTTP = ("/files", "/health")


def _is_control(path: str) -> bool:
    return path in ("/sandboxes", "/v2/sandboxes", "/snapshots", "/volumes") \
        or path.startswith(("/sandboxes/", "/v2/sandboxes/", "/templates/", "/volumes/", "/volumecontent/"))


class E2BApi:
    """The E2B surface of one node: its sandbox table and the three ASGI apps."""

    def __init__(self, service: NodeLocal, token: str | None, max_message: int = MAX_MESSAGE) -> None:
        from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
        from e2b.envd.process.process_connect import ProcessASGIApplication

        self.service, self.token = service, token
        self.table = SandboxTable(service)
        self.control = create_control_app(self.table, service, token, max_file=service.max_file_bytes)
        self.process = ProcessASGIApplication(ProcessService(self.table, service, token),
                                              read_max_bytes=max_message, codecs=codecs())
        self.filesystem = FilesystemASGIApplication(FilesystemService(self.table, service, token),
                                                    read_max_bytes=max_message, codecs=codecs())

    def route(self, path: str) -> Any | None:
        """The app for an E2B path, or None for the node's own routes."""
        if path.startswith("/process.Process/"):
            return self.process
        if path.startswith("/filesystem.Filesystem/"):
            return self.filesystem
        if path in _ENVD_HTTP or _is_control(path):
            return self.control
        return None

    async def gate(self, scope: dict[str, Any], send: Any) -> bool:
        """For envd paths: is the named sandbox here and the access token right? Else answer."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        sandbox_id = headers.get(SANDBOX_HEADER, "")
        if not sandbox_id:
            await _plain(send, 400, "the E2b-Sandbox-Id header is required (E2B_SANDBOX_URL points at a node)")
            return False
        try:
            box = await anyio.to_thread.run_sync(self.table.get, sandbox_id)
        except SandboxNotFound:
            await _plain(send, 502, f"The sandbox {sandbox_id} was not found")
            return False
        except EnvironmentPaused as exc:  # connect resumes it, or this request if it auto-resumes
            box = self.table.peek(sandbox_id)
            if box is None or not box.auto_resume:
                await _plain(send, exc.status, f"{exc.code}: {exc.message}")
                return False
            try:
                box = await anyio.to_thread.run_sync(self.table.resume, sandbox_id)
            except Exception as resume_exc:  # noqa: BLE001 - answered with its code, never a traceback
                status = getattr(resume_exc, "status", 500)
                await _plain(send, status, f"{getattr(resume_exc, 'code', 'internal')}: {resume_exc}")
                return False
        except Exception as exc:  # noqa: BLE001 - answered, never a traceback to the client
            log.exception("looking up sandbox %s failed", sandbox_id)
            await _plain(send, 500, f"internal error: {type(exc).__name__}: {exc}")
            return False
        if not box.token_ok(headers.get(TOKEN_HEADER), self.token):
            await _plain(send, 401, "missing or wrong X-Access-Token for this sandbox")
            return False
        return True


async def _plain(send: Any, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class E2BDispatch:
    """ASGI middleware: E2B paths to `E2BApi`, the rest to the wrapped node app."""

    def __init__(self, app: Any, api: E2BApi) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            target = self.api.route(path)
            if target is not None:
                if path.startswith(_CONNECT_PREFIXES) or path == "/files" or path == "/health":
                    if not await self.api.gate(scope, send):
                        return
                await target(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install(app: Any, service: NodeLocal, token: str | None) -> E2BApi:
    """Serve the E2B-compatible API on `app` (the node's FastAPI app) beside its own routes."""
    api = E2BApi(service, token)
    app.add_middleware(E2BDispatch, api=api)
    app.state.e2b = api
    return api
