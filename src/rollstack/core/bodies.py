"""Request bodies read with a cap (the node's files API and the E2B API's uploads)."""

from __future__ import annotations

from typing import Any

from rollstack.errors import InvalidRequest


async def read_capped(request: Any, cap: int) -> bytes:
    """A Starlette request's body, refused (InvalidRequest) once it passes `cap` bytes,
    declared or not: a chunked upload without a length is cut off as it streams, never
    buffered whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise InvalidRequest(f"{declared} bytes exceed the files API limit of {cap}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise InvalidRequest(f"the upload exceeds the files API limit of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
