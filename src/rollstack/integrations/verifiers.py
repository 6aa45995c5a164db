"""A verifiers (v1) runtime backed by rollstack: `RollstackRuntime` implements
`verifiers.v1.runtimes.Runtime` over one rollstack environment per box.

    from rollstack.integrations.verifiers import RollstackConfig, provision
    async with provision(RollstackConfig(plan="tasks/app-0.yaml")) as box:   # start() ... stop()
        trace = await agent.run(task, runtime=box)                          # verifiers' borrowed box
        # or directly: await box.run(["pytest", "-q"], {}), box.read(...), box.write(...)

What maps to what:
- `start()` creates the environment from `plan` (a plan path, dict, or published `NAME:TAG`) on
  the node (`node`/`token`, default $ROLLSTACK_NODE/$ROLLSTACK_TOKEN); `info.id` is its id. The
  create is shielded from cancellation (as verifiers' E2B runtime does), so a cancelled rollout
  still finds, and tears down, what it created.
- `run(argv, env)` -> `ProgramResult(exit_code, stdout, stderr)`: argv as is (no shell), in
  `workdir` (default: the plan's), env = the runtime's + the process's (`process_env`). A
  non-zero exit is a result. `exec_timeout` (default none) kills the process tree: exit 124.
  A node or environment failure raises verifiers' `SandboxError` (from the rollstack error).
- `with_user(user)` runs as an existing user of the box (`su USER -s /bin/sh -c`), as verifiers'
  `TaskData.agent_user` asks; files written by such a view are chowned to that user.
- `read(path[, max_bytes])`, `write(path, data)`: rollstack's files API (relative paths are
  under `workdir`; parents are created); `max_bytes` reads go through verifiers' own bounded
  shell read. A missing file raises `SandboxError`, as verifiers expects.
- `run_background(argv, env, log)` starts the program in a session of its own (`setsid`: the
  node ends an exec's process group with the exec), output to `log`; it lives until `stop()`.
- `stop()`/`teardown()` destroy the environment (idempotent); `cleanup()` is verifiers' sync
  atexit backstop: it destroys by id through the sync client.
- Extra: `evaluate()` runs the plan's clean evaluator on the box's diff, and `evaluator_reward`
  is a `@vf.reward`-style hook (`async (runtime) -> float`) that a `Task` can plug so the
  rollout's reward comes from it.

Not supported: `open_process` (live stdio sessions; `supports_live_processes` is False),
`expose` (environments have no network: `network: none` is the only plan setting today), and
verifiers' network policies. verifiers' built-in harnesses install `uv` and reach the model's
interception endpoint from inside the box, so they need network egress that rollstack
environments do not have yet; harnesses whose program runs offline in the box work.

Registration: verifiers' `RuntimeConfig` is a closed, discriminated union (subprocess, docker,
podman, apptainer, prime, modal, e2b) and `make_runtime` dispatches on a fixed dict, so a
`{type = "rollstack"}` runtime cannot be named in an agent's config today. Use verifiers'
borrowed-box path instead (`Agent.run(task, runtime=box)` / `Agent.interaction(...,
runtime=box)`, with `provision(...)` owning the box). Making it configurable upstream needs
`RollstackConfig` in the `RuntimeConfig` (and `RollstackRuntimeInfo` in `RuntimeInfo`) unions
and `"rollstack": RollstackRuntime` in `_runtime_cls`: nothing else in verifiers names a runtime
type.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import AsyncIterator
from pathlib import PurePosixPath
from typing import Any, ClassVar, Literal

from pydantic import Field
from pydantic_config import BaseConfig
from verifiers.v1.errors import SandboxError
from verifiers.v1.runtimes.base import BaseRuntimeInfo, ProgramResult, Runtime
from verifiers.v1.utils.aio import run_shielded

from rollstack.errors import NotFound, RollstackError
from rollstack.integrations.slime import TIMEOUT_EXIT, user_argv

logger = logging.getLogger(__name__)


class RollstackConfig(BaseConfig):
    type: Literal["rollstack"] = "rollstack"
    plan: str | dict[str, Any]
    """A plan file path, a plan dict, or a published template `NAME:TAG`."""
    node: str | None = None
    """Node URL (default $ROLLSTACK_NODE, else http://127.0.0.1:7878)."""
    token: str | None = Field(default=None, repr=False)
    """Bearer token (default $ROLLSTACK_TOKEN, else the node's token file)."""
    workdir: str | None = None
    """Where commands run and relative paths resolve (default: the plan's workdir)."""
    exec_timeout: float | None = Field(default=None, gt=0)
    """Seconds one `run` may take (None: no deadline of its own; the agent's timeouts govern)."""


class RollstackRuntimeInfo(RollstackConfig, BaseRuntimeInfo):
    pass


def _sandbox_error(what: str, exc: RollstackError) -> SandboxError:
    return SandboxError(f"rollstack {what} failed: {exc.code}: {exc}")


class RollstackRuntime(Runtime):
    is_local: ClassVar[bool] = True
    supports_user: ClassVar[bool] = True

    def __init__(self, config: RollstackConfig, name: str | None = None) -> None:
        super().__init__(name)
        self.config = config
        self.info = RollstackRuntimeInfo(**config.model_dump())
        self.client: Any = None
        self.environment: Any = None
        self.workdir: str = config.workdir or "/"

    async def start(self) -> None:
        from rollstack.client._clients import AsyncClient

        if self.environment is not None:
            raise SandboxError(f"runtime {self.name} is already started")

        async def create() -> None:
            self.client = AsyncClient(self.config.node, self.config.token)
            self.environment = await self.client.create(self.config.plan)
            self.info.id = self.environment.id   # recorded at once: cleanup() keys off it

        try:
            await run_shielded(create())
            if self.config.workdir is None:   # the plan's workdir: where a command starts by default
                pwd = await self.environment.exec(["pwd"], timeout=30)
                self.workdir = pwd.stdout.strip() if pwd.exit_code == 0 and pwd.stdout.startswith("/") else "/"
        except RollstackError as exc:
            raise _sandbox_error("create", exc) from exc

    def _box(self) -> Any:
        if self.environment is None:
            raise SandboxError(f"runtime {self.name} is not started (or already stopped)")
        return self.environment

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else str(PurePosixPath(self.workdir) / path)

    def _argv(self, argv: list[str]) -> list[str]:
        if self.user is None:
            return list(argv)
        command = f"exec {shlex.join(argv)}"
        if self.home is not None:   # su sets HOME to the user's own; verifiers' view may name another
            command = f"export HOME={shlex.quote(self.home)}; {command}"
        return user_argv(command, self.user, ["/bin/sh", "-c"])

    async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        if not argv:
            raise SandboxError("run needs a non-empty argv")
        try:
            result = await self._box().exec(self._argv(argv), timeout=self.config.exec_timeout,
                                            cwd=self.workdir, env=self.process_env(env))
        except RollstackError as exc:
            raise _sandbox_error("exec", exc) from exc
        code = TIMEOUT_EXIT if result.timed_out else result.exit_code
        return ProgramResult(code, result.stdout, result.stderr)

    async def run_background(self, argv: list[str], env: dict[str, str], log: str) -> None:
        # setsid: the node ends an exec's process group with the exec; a new session outlives it
        inner = f"setsid {shlex.join(argv)} > {shlex.quote(self._abs(log))} 2>&1 < /dev/null &"
        result = await self.run(["sh", "-c", inner], env)
        if result.exit_code != 0:
            raise SandboxError(f"rollstack background launch failed: {result.stderr.strip()[-500:]}")

    async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None:
            return await super()._read(path, max_bytes)   # verifiers' bounded read, in the box
        try:
            return await self._box().read_file(self._abs(path))
        except NotFound as exc:
            raise SandboxError(f"read {path!r}: {exc}") from exc
        except RollstackError as exc:
            raise _sandbox_error(f"read {path!r}", exc) from exc

    async def write(self, path: str, data: bytes) -> None:
        target = self._abs(path)
        try:
            await self._box().write_file(target, data)
        except RollstackError as exc:
            raise _sandbox_error(f"write {path!r}", exc) from exc
        if self.user is not None:
            result = await self.with_user(None).run(["chown", self.user, target], {})
            if result.exit_code != 0:
                raise SandboxError(f"chown {target} to {self.user}: {result.stderr.strip()[-500:]}")

    async def evaluate(self) -> Any:
        """The plan's clean evaluator on this box's diff (`rollstack.contract.models.Evaluation`)."""
        try:
            return await self._box().evaluate()
        except RollstackError as exc:
            raise _sandbox_error("evaluate", exc) from exc

    async def teardown(self) -> None:
        env, client = self.environment, self.client
        try:
            if env is not None:
                await env.destroy()
        except RollstackError as exc:   # best effort, as verifiers' runtimes; cleanup() may retry
            logger.warning("rollstack: destroying %s failed: %s", self.info.id, exc)
            return
        finally:
            if client is not None:
                self.client = None
                await client.aclose()
        self.environment = None

    def cleanup(self) -> None:
        """Sync backstop (verifiers' atexit hook): destroy the environment by id."""
        if self.environment is None or self.info.id is None:
            return
        from rollstack.client._clients import Client

        try:
            with Client(self.config.node, self.config.token) as client:
                client.destroy(self.info.id)
        except RollstackError as exc:
            logger.warning("rollstack: cleanup of %s failed: %s", self.info.id, exc)
            return
        self.environment = None


@contextlib.asynccontextmanager
async def provision(config: RollstackConfig, name: str | None = None,
                    env: dict[str, str] | None = None) -> AsyncIterator[RollstackRuntime]:
    """verifiers' `provision_runtime` for a `RollstackConfig` (which its closed `RuntimeConfig`
    union does not admit): start, yield, and always stop; tracked by verifiers' atexit backstop."""
    from verifiers.v1.runtimes.base import register

    runtime = RollstackRuntime(config, name)
    register(runtime)
    runtime.env = dict(env or {})
    try:
        await runtime.start()
        yield runtime
    finally:
        await runtime.stop()


async def evaluator_reward(runtime: Any) -> float:
    """A verifiers reward hook: the plan's evaluator's reward for the rollout's box."""
    if not isinstance(runtime, RollstackRuntime):
        raise SandboxError(f"evaluator_reward needs a RollstackRuntime, not {type(runtime).__name__}")
    return float((await runtime.evaluate()).reward)


__all__ = ["RollstackConfig", "RollstackRuntime", "RollstackRuntimeInfo", "evaluator_reward", "provision"]
