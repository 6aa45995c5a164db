"""Environments as the lazy store sees them: who is reading, and what it has cost.

A FUSE request carries the pid of the process that caused it. The runtime puts every
environment's processes in the cgroup `rollstack/<env-id>`, so `/proc/<pid>/cgroup` names the
environment. Lookups are cached per pid for a few seconds (pids are reused, but not that fast);
reads by pids outside any environment count node-wide only.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import trio

from rollstack.fetch.stats import Account
from rollstack.fetch.traces import TraceRecorder

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
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)

    def stats(self) -> dict:
        doc = self.account.summary()
        doc.update(env_id=self.id, age_seconds=round(time.monotonic() - self.started, 3),
                   trace_key=self.trace_key, trace_prefetch_chunks=self.prefetch_chunks,
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
