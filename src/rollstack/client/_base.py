"""What `Client` and `AsyncClient` share: defaults, plan encoding, request building, error mapping.

Transport-level failures are translated here, once: connection refused/reset -> `NodeUnavailable`;
an error answer -> the typed error of its `code` (`rollstack.errors.from_dict`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rollstack.errors import InvalidRequest, NodeUnavailable, RollstackError, from_dict
from rollstack.contract.models import ExecRequest

DEFAULT_NODE = "http://127.0.0.1:7878"
DEFAULT_ROOT = Path("/var/lib/rollstack")
TOKEN_FILE = "token"
CONNECT_TIMEOUT = 10.0
SHORT_TIMEOUT = 60.0
"""Seconds for calls that do not run user work (files, list, destroy...)."""
EXEC_ANSWER_SLACK = 30.0
"""Seconds past an exec's own timeout the node has to answer it (it reports the timeout itself)."""


def default_node() -> str:
    return os.environ.get("ROLLSTACK_NODE") or DEFAULT_NODE


def default_token(root: Path | str | None = None) -> str | None:
    """$ROLLSTACK_TOKEN, else the token file in the node's root (if this user can read it)."""
    env = os.environ.get("ROLLSTACK_TOKEN")
    if env:
        return env.strip()
    base = Path(root or os.environ.get("ROLLSTACK_ROOT") or DEFAULT_ROOT)
    try:
        return (base / TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def plan_to_wire(plan: Any) -> dict[str, Any] | str:
    """A plan given as a dict, a path to a YAML/JSON file, a `Plan`, or a published plan's
    `NAME:TAG` -> the JSON the API takes.

    A file plan is validated here and its mutation file (relative to the plan file) is read and
    sent inline as `mutation_text`, since the node cannot see the caller's files. A dict goes as
    is (the node validates it). A string that is no existing file but spells `NAME[:TAG]` goes
    as is: the node resolves it from its store (`rollstack plan publish`).
    """
    if isinstance(plan, dict):
        return plan
    from rollstack.plan.published import is_plan_ref

    if isinstance(plan, (str, Path)) and is_plan_ref(str(plan)):
        return str(plan)
    if not isinstance(plan, (str, Path)) and getattr(plan, "model_dump", None) is None:
        raise InvalidRequest(f"a plan is a dict, a path or a Plan, not {type(plan).__name__}")
    from rollstack.plan.model import load_plan

    loaded = load_plan(plan)
    wire = loaded.model_dump(mode="json", exclude_none=True)
    if loaded.mutation_text is not None:
        wire.pop("mutation", None)
    return wire


def exec_request(
    command: str | list[str],
    timeout: float | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    stdin: str | bytes | None = None,
) -> ExecRequest:
    """`command` as a shell string (run by /bin/sh -c) or an argv list."""
    if isinstance(stdin, bytes):
        stdin = stdin.decode("utf-8", "replace")
    kwargs: dict[str, Any] = {"timeout": timeout, "cwd": cwd, "env": dict(env or {}), "stdin": stdin}
    if isinstance(command, str):
        return ExecRequest(command=command, **kwargs)
    return ExecRequest(argv=[str(a) for a in command], **kwargs)


def request_timeout(seconds: float | None) -> httpx.Timeout:
    """For calls that run user work: no read deadline of ours beyond the work's own plus slack."""
    read = None if seconds is None else seconds + EXEC_ANSWER_SLACK
    return httpx.Timeout(connect=CONNECT_TIMEOUT, read=read, write=SHORT_TIMEOUT, pool=None)


@dataclass
class Settings:
    url: str = field(default_factory=default_node)
    token: str | None = None

    @classmethod
    def of(cls, url: str | None, token: str | None) -> "Settings":
        """What a client was given, with the defaults ($ROLLSTACK_NODE, the token) for the rest."""
        settings = cls(token=token if token is not None else default_token())
        if url:
            settings.url = url
        return settings

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def raise_for(response: httpx.Response) -> None:
    """Raise the typed error an error answer carries; return for success."""
    if response.status_code < 400:
        return
    raise error_of(response.status_code, response.content)


def error_of(status: int, content: bytes) -> RollstackError:
    import json

    try:
        body = json.loads(content)
        err = body["error"]
        if isinstance(err, dict) and "code" in err:
            return from_dict(err)
    except (ValueError, KeyError, TypeError):
        pass
    text = content.decode("utf-8", "replace").strip()[:300]
    err = RollstackError(f"HTTP {status}: {text}")
    err.status = status
    return err


def transport_error(exc: httpx.TransportError, url: str) -> RollstackError:
    """httpx's connection failures -> NodeUnavailable (the node is down or unreachable)."""
    if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return NodeUnavailable(f"node at {url} unavailable: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return NodeUnavailable(f"node at {url} did not answer in time: {exc}")
    return NodeUnavailable(f"node at {url}: {type(exc).__name__}: {exc}")
