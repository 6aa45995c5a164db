"""What the envd Connect services share: finding the request's sandbox, worker threads, and
turning every error into a `ConnectError` the SDK maps to its own exceptions.

The sandbox comes from the `E2b-Sandbox-Id` header (the dispatcher in `rollstack.e2b.app` has
checked it and the `X-Access-Token` already; it is looked up again here because the sandbox may
end in between). Codes: NotFound -> NOT_FOUND, AlreadyExists -> ALREADY_EXISTS, bad input ->
INVALID_ARGUMENT, capacity -> RESOURCE_EXHAUSTED, a sandbox that is gone -> UNAVAILABLE with
E2B's "was not found" wording (the SDK then raises SandboxNotRunningException), anything else
-> INTERNAL with the reason; the error is logged with its traceback, the client never sees one.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, AsyncIterator, Callable, TypeVar

import anyio
import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError

from rollstack.e2b.sandboxes import Sandbox, SandboxTable
from rollstack.errors import (
    AlreadyExists, EnvironmentGone, InsufficientCapacity, InvalidRequest, NotFound, OomTerminated,
    RollstackError, SandboxNotFound, Unauthorized,
)
from rollstack.contract.service import NodeLocal

log = logging.getLogger(__name__)
T = TypeVar("T")

SANDBOX_HEADER = "e2b-sandbox-id"
TOKEN_HEADER = "x-access-token"


class CheckedCodec:
    """A codec whose decode failures are INVALID_ARGUMENT (connectrpc would answer UNKNOWN and
    re-raise the decoder's exception into the ASGI server, which logs a traceback)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def name(self) -> str:
        return str(self._inner.name())

    def encode(self, message: Any) -> bytes:
        return bytes(self._inner.encode(message))

    def decode(self, data: bytes | bytearray, message_class: type[T]) -> T:
        try:
            return self._inner.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the client's bad input
            raise ConnectError(Code.INVALID_ARGUMENT,
                               f"cannot decode {message_class.__name__}: {type(exc).__name__}: {exc}") from None


def codecs() -> list[CheckedCodec]:
    """Binary protobuf and JSON (what the SDK speaks; unknown fields ignored for newer SDKs)."""
    from connectrpc.codec import proto_binary_codec, proto_json_codec

    return [CheckedCodec(proto_binary_codec()), CheckedCodec(proto_json_codec(ignore_unknown_fields=True))]


def unimplemented(message: str) -> ConnectError:
    return ConnectError(Code.UNIMPLEMENTED, message)


def to_connect_error(exc: BaseException) -> ConnectError:
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, (SandboxNotFound, EnvironmentGone, OomTerminated)):
        return ConnectError(Code.UNAVAILABLE, f"sandbox was not found: {exc}")
    if isinstance(exc, AlreadyExists):
        return ConnectError(Code.ALREADY_EXISTS, str(exc))
    if isinstance(exc, NotFound):
        return ConnectError(Code.NOT_FOUND, str(exc))
    if isinstance(exc, InvalidRequest):
        return ConnectError(Code.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, InsufficientCapacity):
        return ConnectError(Code.RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, Unauthorized):
        return ConnectError(Code.UNAUTHENTICATED, str(exc))
    if isinstance(exc, RollstackError):
        return ConnectError(Code.INTERNAL, f"{exc.code}: {exc}")
    log.error("envd handler failed", exc_info=exc)
    return ConnectError(Code.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


class Envd:
    """Base of the envd services: `call` (unary), `stream` (server streams), `run` (threads)."""

    def __init__(self, table: SandboxTable, service: NodeLocal, token: str | None, threads: int = 64) -> None:
        self.table, self.service, self.token = table, service, token
        self._threads = threads
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self._threads)
        return await anyio.to_thread.run_sync(partial(fn, *args), limiter=self._limiter)

    async def sandbox(self, ctx: Any) -> Sandbox:
        sandbox_id = ctx.request_headers.get(SANDBOX_HEADER)
        if not sandbox_id:
            raise ConnectError(Code.INVALID_ARGUMENT, "the E2b-Sandbox-Id header is required")
        box = await self.run(self.table.get, sandbox_id)
        if not box.token_ok(ctx.request_headers.get(TOKEN_HEADER), self.token):
            raise ConnectError(Code.UNAUTHENTICATED, "missing or wrong X-Access-Token for this sandbox")
        return box

    @asynccontextmanager
    async def call(self, ctx: Any) -> AsyncIterator[Sandbox]:
        try:
            yield await self.sandbox(ctx)
        except Exception as exc:  # noqa: BLE001 - mapped, never leaked as a traceback
            raise to_connect_error(exc) from None

    @staticmethod
    async def stream(ctx: Any, events: AsyncIterator[T]) -> AsyncIterator[T]:
        try:
            async for event in events:
                yield event
        except Exception as exc:  # noqa: BLE001 - mapped, never leaked as a traceback
            raise to_connect_error(exc) from None
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
