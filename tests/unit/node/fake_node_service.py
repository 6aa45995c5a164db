"""An in-memory `EnvironmentService` for API and SDK tests (no runc, no mounts)."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

from rollstack.errors import EnvironmentNotFound, InsufficientCapacity, PlanInvalid, UnsafePath
from rollstack.contract.service import OffloadedExec
from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    Health,
    LeaseRenewal,
    Snapshot,
    Stats,
    Timings,
)


class FakeService(OffloadedExec):
    max_file_bytes = 1 << 30
    def __init__(self, max_environments: int = 4) -> None:
        self.max = max_environments
        self.envs: dict[str, dict[str, bytes]] = {}
        self.destroyed: set[str] = set()
        self.ids = itertools.count(1)
        self.last_exec: ExecRequest | None = None
        self.leases: dict[str, float] = {}
        self.paused: set[str] = set()
        self.pause_modes: dict[str, str] = {}
        self.snapshots: dict[str, dict[str, bytes]] = {}
        self.renewals: list[list[str]] = []
        self.keys: dict[str, CreateResponse] = {}
        self.create_options: list[dict[str, Any]] = []

    def _env(self, env_id: str) -> dict[str, bytes]:
        if env_id not in self.envs:
            raise EnvironmentNotFound(f"no environment {env_id}")
        return self.envs[env_id]

    def create(self, plan: dict[str, Any], **options: Any) -> CreateResponse:
        self.create_options.append(options)
        key = options.get("idempotency_key")
        if key in self.keys:
            return self.keys[key]
        if "groups" not in plan:
            raise PlanInvalid("plan has no groups")
        if len(self.envs) >= self.max:
            raise InsufficientCapacity("full")
        env_id = f"env-{next(self.ids)}"
        self.envs[env_id] = {}
        if options.get("lease") is not None:
            self.leases[env_id] = options["lease"]
        created = CreateResponse(id=env_id, timings=Timings(total=0.01))
        if key is not None:
            self.keys[key] = created
        return created

    def create_many(self, plan: dict[str, Any], count: int, **options: Any) -> list[CreateResponse]:
        if len(self.envs) + count > self.max:
            raise InsufficientCapacity("full")
        lease = {"lease": options["lease"]} if "lease" in options else {}
        return [self.create(plan, **lease) for _ in range(count)]

    def fork(self, env_id: str, count: int = 1, lease: float | None = None) -> list[CreateResponse]:
        """Children with a copy of the parent's files (all or none)."""
        files = self._env(env_id)
        if len(self.envs) + count > self.max:
            raise InsufficientCapacity("full")
        made = self.create_many({"groups": []}, count, **({"lease": lease} if lease is not None else {}))
        for c in made:
            self.envs[c.id] = dict(files)
        return made

    def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo:
        self._env(env_id)
        self.paused.add(env_id)
        self.pause_modes[env_id] = mode
        return self.info(env_id)

    def resume(self, env_id: str) -> EnvironmentInfo:
        self._env(env_id)
        self.paused.discard(env_id)
        return self.info(env_id)

    def snapshot(self, env_id: str, name: str) -> Snapshot:
        self._env(env_id)
        self.snapshots[name] = dict(self.envs[env_id])
        return Snapshot(plan=name, group=f"{name.split(':')[0]}-fs:{name.split(':')[1]}", layer="sha256:" + "0" * 64,
                        files=len(self.envs[env_id]), bytes=0, seconds=0.0)

    def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal:
        self.renewals.append(list(env_ids))
        return LeaseRenewal(renewed=[i for i in env_ids if i in self.envs],
                            missing=[i for i in env_ids if i not in self.envs])

    def list(self) -> list[EnvironmentInfo]:
        return [self.info(i) for i in self.envs]

    def info(self, env_id: str) -> EnvironmentInfo:
        self._env(env_id)
        return EnvironmentInfo(id=env_id, state="paused" if env_id in self.paused else "running", plan_name="fake")

    def exec(self, env_id: str, request: ExecRequest) -> ExecResult:
        self._env(env_id)
        self.last_exec = request
        argv = request.resolved_argv()
        if argv[:1] == ["fail"]:
            return ExecResult(exit_code=3, stderr="failed\n")
        return ExecResult(exit_code=0, stdout=" ".join(argv) + "\n" + (request.stdin or ""))

    def exec_stream(self, env_id: str, request: ExecRequest) -> Iterator[ExecChunk]:
        self._env(env_id)
        self.last_exec = request
        return self._stream(request)

    def _stream(self, request: ExecRequest) -> Iterator[ExecChunk]:
        for word in request.resolved_argv():
            yield ExecChunk(type="stdout", data=word + "\n")
        yield ExecChunk(type="stderr", data="err\n")
        if request.argv and request.argv[0] == "explode":
            raise PlanInvalid("boom mid-stream")
        yield ExecChunk(type="result", result=ExecResult(exit_code=7))

    def read_file(self, env_id: str, path: str) -> bytes:
        files = self._env(env_id)
        if ".." in path:
            raise UnsafePath(f"{path} escapes the root")
        if path not in files:
            from rollstack.errors import NotFound

            raise NotFound(f"no file {path}")
        return files[path]

    def write_file(self, env_id: str, path: str, data: bytes) -> None:
        if ".." in path:
            raise UnsafePath(f"{path} escapes the root")
        self._env(env_id)[path] = data

    def diff(self, env_id: str, binary: str = "name") -> str:
        return "".join(f"--- a{p}\n+++ b{p}\n" for p in sorted(self._env(env_id)))

    def evaluate(self, env_id: str) -> Evaluation:
        self._env(env_id)
        return Evaluation(reward=1.0, exit_code=0, output="ok", timings={"total": 0.1})

    def stats(self, env_id: str) -> Stats:
        self._env(env_id)
        return Stats(history=[{"t": 0.0, "cpu_limit": 0.5, "memory_limit": 1 << 28}], events=[{"type": "start"}])

    def destroy(self, env_id: str) -> None:
        if env_id in self.destroyed:
            return
        self._env(env_id)
        del self.envs[env_id]
        self.destroyed.add(env_id)

    def health(self) -> Health:
        return Health(environments=len(self.envs))

    def metrics(self) -> dict[str, float]:
        return {"environments": float(len(self.envs))}
