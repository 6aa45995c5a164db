"""Fakes for the adapter unit tests: environments whose exec answers come from a script, sync and
async, plus a client that can be told to fail `create`/`evaluate` with typed errors."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from rollstack.errors import InsufficientCapacity
from rollstack.contract.models import CreateResponse, Evaluation, ExecResult, Timings

Handler = Callable[[Any, dict[str, Any]], ExecResult]


def default_handler(command: Any, kwargs: dict[str, Any]) -> ExecResult:
    text = command if isinstance(command, str) else " ".join(command)
    body = text.removeprefix("exec 2>&1\n")
    if body.startswith("echo "):
        return ExecResult(exit_code=0, stdout=body[5:] + "\n")
    if body.startswith("fail"):
        return ExecResult(exit_code=2, stdout="", stderr="boom\n")
    if body.startswith("sleep"):
        return ExecResult(exit_code=-1, stdout="partial\n", timed_out=True)
    return ExecResult(exit_code=0, stdout=f"ran {body}\n")


class FakeEnv:
    def __init__(self, client: "FakeClient", env_id: str, plan: Any) -> None:
        self.client, self.id, self.plan = client, env_id, plan
        self.created = CreateResponse(id=env_id, timings=Timings(total=0.25))
        self.execs: list[tuple[Any, dict[str, Any]]] = []
        self.files: dict[str, bytes] = {}
        self.destroyed = 0

    def exec(self, command: Any, **kwargs: Any) -> ExecResult:
        self.execs.append((command, kwargs))
        self.client.exec_hook(self)
        return self.client.handler(command, kwargs)

    def write_file(self, path: str, data: bytes) -> None:
        self.files[path] = data

    def evaluate(self) -> Evaluation:
        self.client.evaluations += 1
        if self.client.eval_errors:
            raise self.client.eval_errors.pop(0)
        return Evaluation(reward=self.client.reward_of(self), exit_code=0)

    def destroy(self) -> None:
        self.destroyed += 1
        self.client.live.discard(self.id)


class FakeClient:
    def __init__(self, handler: Handler = default_handler) -> None:
        self.handler = handler
        self.envs: list[FakeEnv] = []
        self.live: set[str] = set()
        self.create_errors: list[Exception] = []
        self.eval_errors: list[Exception] = []
        self.exec_hook: Callable[[FakeEnv], None] = lambda env: None
        self.reward_of: Callable[[FakeEnv], float] = lambda env: 1.0
        self.evaluations = 0
        self.closed = False
        self.capacity: int | None = None

    def create(self, plan: Any) -> FakeEnv:
        if self.create_errors:
            raise self.create_errors.pop(0)
        if self.capacity is not None and len(self.live) >= self.capacity:
            raise InsufficientCapacity("node full")
        env = FakeEnv(self, f"env-{len(self.envs) + 1}", plan)
        self.envs.append(env)
        self.live.add(env.id)
        return env

    def close(self) -> None:
        self.closed = True


class AsyncFakeEnv:
    def __init__(self, env: FakeEnv) -> None:
        self._env = env
        self.id = env.id
        self.created = env.created

    async def exec(self, command: Any, **kwargs: Any) -> ExecResult:
        await asyncio.sleep(0)  # let other rollouts interleave, as over a network
        return self._env.exec(command, **kwargs)

    async def write_file(self, path: str, data: bytes) -> None:
        self._env.write_file(path, data)

    async def evaluate(self) -> Evaluation:
        await asyncio.sleep(0)
        client = self._env.client
        if client.capacity is not None and len(client.live) >= client.capacity:
            raise InsufficientCapacity("no room for the evaluator")  # it needs an environment of its own
        return self._env.evaluate()

    async def destroy(self) -> None:
        self._env.destroy()


class AsyncFakeClient:
    def __init__(self, inner: FakeClient | None = None) -> None:
        self.inner = inner or FakeClient()
        self.max_live = 0
        self.groups: list[int] = []

    async def create(self, plan: Any, count: int | None = None) -> Any:
        if count is not None:  # a group: all or none
            self.groups.append(count)
            return [await self.create(plan) for _ in range(count)]
        env = AsyncFakeEnv(self.inner.create(plan))
        self.max_live = max(self.max_live, len(self.inner.live))
        return env

    async def aclose(self) -> None:
        self.inner.closed = True
