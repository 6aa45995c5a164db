"""slime's sandbox protocol (`slime.agent.sandbox.Sandbox`) over a rollstack environment.

    async with RollstackSandbox("tasks/app-0.yaml") as sb:     # a plan file, dict, or NAME:TAG
        rc, out, err = await sb.exec("pytest -q", timeout=600)
        await sb.write_file("/tmp/fix.diff", diff_text)
        text = await sb.read_file("/work/app/setup.cfg")

slime's contract (its `Sandbox` Protocol, implemented there only by `E2BSandbox`): a
`sandbox_id` attribute; `async with` creates and kills the box; `exec(cmd, *, user="root",
env=None, timeout=120, check=False, idempotent=True) -> (exit_code, stdout, stderr)`;
`write_file(sandbox_path, content: str | bytes | Path, *, user="root")` (a `Path` is a host
file to copy in); `read_file(sandbox_path, *, user="root") -> str`. The signatures here are
the same, so slime's helpers (`exec_and_wait`, `ensure_agent_user`, the harnesses) take a
`RollstackSandbox` where they take an `E2BSandbox`, and `RollstackSandbox(image)` has the
constructor shape slime's `boot_agent_sandbox` calls (`E2BSandbox(image)`): the "image" is a
rollstack plan (path, dict, or published `NAME:TAG`).

Behaviour, matched to `E2BSandbox`:
- `exec` runs `cmd` through a shell (`shell`, default `/bin/sh -c`; E2B uses `bash -l -c`), in
  the plan's workdir, with `env` on top of the plan's. A non-zero exit is returned, not raised,
  unless `check=True`: then `CommandFailed` (a `RuntimeError`, as slime's is) with the exit code
  and the head of stderr.
- `user` other than root runs the command through `su USER -s SHELL -c` (the user must exist in
  the environment, e.g. made by slime's `ensure_agent_user`); files written for a user are
  `chown`ed to it. rollstack's files API itself runs as root.
- On `timeout` the node kills the command's process tree; the result is exit code 124 with the
  partial output (E2B raises its `TimeoutException` instead); with `check=True`, `CommandFailed`.
- `read_file` of a missing file returns "" (as `E2BSandbox.read_file` does for any failure);
  other errors (environment gone, unsafe path, ...) are raised as their `rollstack.errors` class.
- `idempotent` is accepted and ignored: this backend does not replay calls (slime's protocol
  lets backends without transport retries ignore it).
- Leaving the `async with` destroys the environment, even when the body raised; `__aexit__`
  never raises (slime's logs a failed kill and goes on; so does this).

Extra, not in slime's protocol: `evaluate()` (the plan's clean evaluator on this environment's
diff), `diff()`, and `environment` (the `AsyncEnvironment` handle).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
from pathlib import Path
from typing import Any

from rollstack.errors import CommandFailed, InvalidRequest, NotFound
from rollstack.integrations.connect import async_client

logger = logging.getLogger(__name__)

ExecResult = tuple[int, str, str]
FileContent = str | bytes | Path

ROOT_USERS = ("root", "", None)
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
TIMEOUT_EXIT = 124
"""Exit code of a command killed at its timeout (coreutils `timeout`'s, and the node's)."""


def user_argv(cmd: str, user: str | None, shell: list[str]) -> list[str]:
    """The argv that runs `cmd` through `shell` as `user` (root: directly; else via su)."""
    if user in ROOT_USERS:
        return [*shell, cmd]
    assert user is not None
    if not USER_NAME.fullmatch(user):
        raise InvalidRequest(f"not a user name: {user!r}")
    return ["su", user, "-s", shell[0], "-c", cmd]


def failure_message(rc: int, cmd: str, stderr: str) -> str:
    """The `check=True` error text, shaped like slime's (exit code, head of cmd and stderr)."""
    return f"rollstack exec failed (exit={rc}): {cmd[:120]}\n{(stderr or '')[:400]}"


class RollstackSandbox:
    """One rollstack environment behind slime's `Sandbox` protocol (see the module doc)."""

    def __init__(
        self,
        plan: Any,
        *,
        client: Any = None,
        node: str | None = None,
        token: str | None = None,
        shell: list[str] | None = None,
        cwd: str | None = None,
    ) -> None:
        """`plan`: plan path, dict, `Plan`, or a published template `NAME:TAG` (what the node
        accepts). `client`: an `AsyncClient` (left open); else one is built from node/token
        ($ROLLSTACK_NODE / $ROLLSTACK_TOKEN) and closed on exit."""
        if plan is None or plan == "":
            raise InvalidRequest("RollstackSandbox needs a plan (path, dict, or NAME:TAG)")
        self.plan = plan
        self.shell = list(shell) if shell is not None else ["/bin/sh", "-c"]
        if not self.shell:
            raise InvalidRequest("shell must not be empty")
        self.cwd = cwd
        self._client_arg, self._node, self._token = client, node, token
        self.client: Any = None
        self._owns = False
        self.environment: Any = None
        self.sandbox_id = ""

    def __repr__(self) -> str:
        return f"RollstackSandbox({self.sandbox_id or 'not started'})"

    async def __aenter__(self) -> "RollstackSandbox":
        if self.environment is not None:
            raise InvalidRequest("this sandbox is already started")
        self.client, self._owns = async_client(self._client_arg, self._node, self._token)
        try:
            self.environment = await self.client.create(self.plan)
        except BaseException:
            await self._close_client()
            raise
        self.sandbox_id = self.environment.id
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        env, self.environment = self.environment, None
        try:
            if env is not None:
                await env.destroy()
        except Exception as e:  # noqa: BLE001 - like slime's E2BSandbox: log a failed kill, go on
            logger.warning("[rollstack.slime] destroying %s failed: %s", self.sandbox_id, e)
        finally:
            await self._close_client()

    async def _close_client(self) -> None:
        if self._owns and self.client is not None:
            self._owns = False
            await self.client.aclose()

    def _env(self) -> Any:
        if self.environment is None:
            raise InvalidRequest("the sandbox is not started (use `async with`)")
        return self.environment

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult:
        argv = user_argv(cmd, user, self.shell)
        result = await self._env().exec(argv, timeout=timeout if timeout and timeout > 0 else None,
                                        cwd=self.cwd, env=env)
        rc = TIMEOUT_EXIT if result.timed_out else result.exit_code
        if check and rc != 0:
            raise CommandFailed(failure_message(rc, cmd, result.stderr), exit_code=rc,
                                stdout=result.stdout[-2000:], stderr=result.stderr[-2000:])
        return rc, result.stdout, result.stderr

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None:
        if isinstance(content, Path):
            data = await asyncio.to_thread(content.read_bytes)
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        elif isinstance(content, str):
            data = content.encode()
        else:
            raise InvalidRequest(f"write_file content is str, bytes or Path, not {type(content).__name__}")
        await self._env().write_file(sandbox_path, data)
        if user not in ROOT_USERS:
            await self.exec(f"chown {shlex.quote(user)} {shlex.quote(sandbox_path)}", check=True, timeout=60)

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        try:
            data = await self._env().read_file(sandbox_path)
        except NotFound as exc:
            if exc.code != NotFound.code:  # environment_not_found etc. are not "no such file"
                raise
            return ""
        return data.decode("utf-8", "replace")

    # -- beyond slime's protocol --------------------------------------------------------------

    async def evaluate(self) -> Any:
        """The plan's evaluator on this environment's changes (`Evaluation`: reward, ...)."""
        return await self._env().evaluate()

    async def diff(self) -> str:
        return await self._env().diff()


__all__ = ["RollstackSandbox", "CommandFailed", "user_argv"]
