"""Environments as the lazy store sees them: who is reading, what it has cost, what it prefetches.

A FUSE request carries the pid of the process that caused it. The runtime puts every
environment's processes in the cgroup `rollstack/<env-id>`, so `/proc/<pid>/cgroup` names the
environment. Lookups are cached per pid for a few seconds (pids are reused, but not that fast);
reads by pids outside any environment count node-wide only. (That procfs read stays on the FUSE
loop: it is a kernel-generated page, not disk I/O, and runs once per new pid per 5 s.)

`Environments.begin` registers an environment and starts its trace work without waiting for
the network. `trace_key` names its work (stack + task), `fallback_key` the stack's (what any
task's first seconds read):

- this node's traces of both keys are read at once, concurrently (worker threads, local files);
  a task trace found is prefetched, and nothing is recorded;
- otherwise the environment records its own reads under `trace_key` (merged into
  `fallback_key`'s) from its first read on, a local stack trace is prefetched at once, and the
  traces other nodes published for the missing keys are looked up concurrently in the
  background (`trace_lookup: "pending"` until they answered): a shared task trace is prefetched
  when it arrives and ends the recording (that task has a trace), a shared stack trace is
  prefetched when it arrives unless the task's came first.

`trace_source` ("local" | "shared" | "stack-local" | "stack-shared" | None) and
`trace_prefetch_chunks` are final once `trace_lookup` is "done" (env stats, end_env's result).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import trio

from rollstack.errors import InvalidRequest, NotFound
from rollstack.fetch import ChunkFetcher, FetchConfig, Trace, TraceRecorder
from rollstack.fetch.stats import Account
from rollstack.lazystore.layers import LayerTable, digest_hex
from rollstack.lazystore.traces import TraceBook

_CGROUP_ENV = re.compile(r"(?:^|/)rollstack/([A-Za-z0-9][A-Za-z0-9_.-]*)")
_PID_TTL = 5.0


@dataclass
class Env:
    id: str
    layers: list[str]  # layer digests, as given
    trace_key: str | None = None
    account: Account = field(default_factory=Account)
    fallback_key: str | None = None
    recorder: TraceRecorder | None = None
    started: float = field(default_factory=time.monotonic)
    prefetch_chunks: int = 0
    trace_source: str | None = None
    trace_lookup: str = "done"  # "pending" while shared traces are being looked up
    prefetched: set[tuple[str, int]] = field(default_factory=set)  # TraceChunk.key of each chunk asked for
    ended: bool = False
    _tasks: set[trio.CancelScope] = field(default_factory=set)

    async def run(self, fn: Any, *args: Any) -> None:
        """`fn(*args)` as one of this environment's tasks: cancelled when it ends. (One scope per
        task: a trio CancelScope can be entered only once, so one shared scope made the second
        task of an environment to start, e.g. its background fill or its trace prefetch, fail.)"""
        if self.ended:
            return
        with trio.CancelScope() as scope:
            self._tasks.add(scope)
            try:
                await fn(*args)
            finally:
                self._tasks.discard(scope)

    def end(self) -> None:
        """Cancel every task of this environment (running or yet to start)."""
        self.ended = True
        for scope in list(self._tasks):
            scope.cancel()

    def stats(self) -> dict:
        doc = self.account.summary()
        doc.update(env_id=self.id, age_seconds=round(time.monotonic() - self.started, 3),
                   trace_key=self.trace_key, trace_prefetch_chunks=self.prefetch_chunks,
                   trace_source=self.trace_source, trace_lookup=self.trace_lookup,
                   trace_recording=bool(self.recorder and self.recorder.open))
        return doc


def env_id_from_cgroup(text: str) -> str | None:
    """The environment id in a /proc/<pid>/cgroup document, if any (pure)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_ENV.search(path)
        if m:
            return m.group(1)
    return None


class EnvTable:
    def __init__(self) -> None:
        self.envs: dict[str, Env] = {}
        self._pids: dict[int, tuple[float, str | None]] = {}

    def for_pid(self, pid: int) -> Env | None:
        if not self.envs or pid <= 0:
            return None
        now = time.monotonic()
        hit = self._pids.get(pid)
        if hit is None or now - hit[0] > _PID_TTL:
            try:
                with open(f"/proc/{pid}/cgroup") as f:
                    env_id = env_id_from_cgroup(f.read())
            except OSError:
                env_id = None
            if len(self._pids) > 10000:
                self._pids.clear()
            self._pids[pid] = (now, env_id)
        else:
            env_id = hit[1]
        return self.envs.get(env_id) if env_id else None

    def forget_pids(self) -> None:
        self._pids.clear()


class Environments:
    """begin / stats / end of environments, their trace prefetch, recording and background fill."""

    def __init__(self, table: EnvTable, layers: LayerTable, traces: TraceBook, fetcher: ChunkFetcher,
                 config: FetchConfig) -> None:
        self.table, self.layers, self.traces, self.fetcher, self.config = table, layers, traces, fetcher, config

    def get(self, env_id: str) -> Env:
        env = self.table.envs.get(env_id)
        if env is None:
            raise NotFound(f"environment {env_id} is not known to the lazy store")
        return env

    async def begin(self, env_id: str, refs: Iterable[Any], trace_key: str | None = None,
                    background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        return (await self.begin_many([env_id], refs, trace_key, background, fallback_key))["envs"][0]

    async def begin_many(self, env_ids: list[str], refs: Iterable[Any], trace_key: str | None = None,
                         background: bool = True, fallback_key: str | None = None) -> dict[str, Any]:
        """Begin environments that share layers and trace keys (a GRPO group): the layers are
        added and this node's traces of both keys read once; each environment then gets what
        `begin` gives one (its own account, prefetch or recording, background fill).
        {"layers": ..., "envs": [begin's answer per id, in order]}."""
        for env_id in env_ids:
            if not env_id or "/" in env_id:
                raise InvalidRequest(f"bad environment id {env_id!r}")
        if len(set(env_ids)) != len(env_ids):
            raise InvalidRequest("duplicate environment ids")
        added = await self.layers.add(refs)
        found = await self._local_traces(trace_key, fallback_key) if trace_key else {}
        sizes = {d["digest"]: int(d["blob_size"]) for d in added["layers"]}
        out = []
        for env_id in env_ids:
            old = self.table.envs.pop(env_id, None)
            if old is not None:
                old.end()
            env = Env(env_id, [d["digest"] for d in added["layers"]], trace_key, fallback_key=fallback_key)
            self.table.envs[env_id] = env
            if trace_key:
                self._start_traces(env, sizes, found)
            if background:
                self.fetcher.spawn(env.run, self._background_fill, env)
            out.append({"env_id": env_id, "layers": added, "trace_prefetch_chunks": env.prefetch_chunks,
                        "trace_source": env.trace_source, "trace_lookup": env.trace_lookup})
        self.table.forget_pids()
        return {"layers": added, "envs": out}

    async def _local_traces(self, trace_key: str, fallback_key: str | None) -> dict[str, Trace]:
        """This node's traces of the task and stack keys, read concurrently."""
        found: dict[str, Trace] = {}

        async def local(key: str) -> None:
            found[key] = await self.traces.local(key)

        async with trio.open_nursery() as n:
            n.start_soon(local, trace_key)
            if fallback_key:
                n.start_soon(local, fallback_key)
        return found

    def _start_traces(self, env: Env, sizes: dict[str, int], found: dict[str, Trace]) -> None:
        assert env.trace_key is not None
        if found.get(env.trace_key):
            self._use(env, found[env.trace_key], "local")
            return
        # no trace of this task here: record one from the first read on
        env.recorder = TraceRecorder(env.trace_key, self.config.trace_window, self.config.trace_max_chunks)
        self.fetcher.spawn(self._save_later, env)
        stack = found.get(env.fallback_key) if env.fallback_key else None
        if stack:
            self._use(env, stack, "stack-local")
        if self.traces.share:
            env.trace_lookup = "pending"
            self.fetcher.spawn(env.run, self._shared_lookups, env, sizes, not stack)

    async def _shared_lookups(self, env: Env, sizes: dict[str, int], want_stack: bool) -> None:
        """In the background: the traces other nodes published for the keys this node lacks."""
        assert env.trace_key is not None

        async def task_trace() -> None:
            trace = await self.traces.shared_trace(env.trace_key, sizes)
            if trace:
                env.recorder = None  # the task has a trace: nothing to record
                self._use(env, trace, "shared")

        async def stack_trace() -> None:
            assert env.fallback_key is not None
            trace = await self.traces.shared_trace(env.fallback_key, sizes)
            if trace and env.trace_source in (None, "stack-local"):
                self._use(env, trace, "stack-shared")

        try:
            async with trio.open_nursery() as n:
                n.start_soon(task_trace)
                if want_stack and env.fallback_key:
                    n.start_soon(stack_trace)
        finally:
            env.trace_lookup = "done"

    def _use(self, env: Env, trace: Trace, source: str) -> None:
        """Prefetch `trace` for `env`: only its chunks an earlier trace of this environment did
        not already ask for (a task trace arriving after the stack's is mostly the same chunks:
        asking again doubled the prefetch queue the first reads wait behind)."""
        fresh = [t for t in trace if t.key not in env.prefetched]
        env.prefetched.update(t.key for t in fresh)
        env.trace_source = source
        env.prefetch_chunks += len(fresh)
        if fresh:
            self.fetcher.spawn(env.run, self.traces.prefetch, fresh, env.account)

    async def _background_fill(self, env: Env) -> None:
        """The rest of the environment's layers, after a grace period (its first command runs
        on an uncontended node); each request is admitted by the fetcher's background gate."""
        await trio.sleep(self.config.background_grace)
        for digest in env.layers:
            layer = self.layers.get(digest_hex(digest))
            if layer is not None:
                await self.fetcher.fill(layer.remote, env.account)

    async def _save_later(self, env: Env) -> None:
        await trio.sleep(self.config.trace_window)
        await self._save(env)

    async def _save(self, env: Env) -> None:
        rec, env.recorder = env.recorder, None
        if rec is not None:
            await self.traces.save(rec, env.fallback_key)

    async def share_trace(self, env_id: str, keys: list[str]) -> int:
        """What environment `env_id` read (its recording so far, else its task's stored trace)
        saved and published under `keys` too; the number of chunks (0: nothing to share)."""
        env = self.get(env_id)
        trace = list(env.recorder.chunks.values()) if env.recorder is not None else []
        if not trace and env.trace_key:
            trace = await self.traces.local(env.trace_key)
        if trace:
            await self.traces.put(keys, trace)
        return len(trace)

    async def end(self, env_id: str) -> dict[str, Any]:
        env = self.get(env_id)
        del self.table.envs[env_id]
        env.end()
        await self._save(env)
        return env.stats()
