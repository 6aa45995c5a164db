"""Host-side process handling for environments: walking, killing and reaping process trees.

Pids alone are unsafe to act on later (they are reused), so everything killed or to be reaped is
a `ProcRef(pid, start)` with the process's start time from /proc/<pid>/stat; we only ever
waitpid() a pid whose start time still matches and that is a zombie, so a child that another
thread's subprocess.Popen owns can never be reaped by accident.

Why we reap at all: the runtime makes its process a child subreaper (see environment.py), so a
container process whose host-side parent (a `runc exec`) died is re-parented to us. Such a
zombie blocks the container's init from finishing its exit (the kernel's pid-namespace teardown
waits until every member is reaped), so `runc delete` would see a running container forever.
"""

from __future__ import annotations

import os
import signal
from typing import NamedTuple, Sequence


class ProcRef(NamedTuple):
    pid: int
    start: int  # clock ticks since boot (field 22 of /proc/<pid>/stat)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()  # comm may contain spaces and ')'
    try:
        return rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


def ref(pid: int) -> ProcRef | None:
    st = _stat(pid)
    return ProcRef(pid, st[1]) if st else None


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return kids


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (host pids), parents before children."""
    out, todo, seen = [], [pid], {pid}
    while todo:
        for kid in _children(todo.pop()):
            if kid not in seen:
                seen.add(kid)
                out.append(kid)
                todo.append(kid)
    return out


def _signal(refs: Sequence[ProcRef], sig: int) -> None:
    for r in refs:
        st = _stat(r.pid)
        if st is None or st[1] != r.start:
            continue  # gone, or the pid now belongs to someone else
        try:
            os.kill(r.pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(root: ProcRef, rounds: int = 50) -> list[ProcRef]:
    """SIGKILL `root` and every descendant without letting the tree fork away.

    Stop first (a stopped process cannot fork), re-list until no new member appears, then kill
    all. With a subreaper root, orphans created meanwhile still show up under it. Returns what
    was killed (for `reap`). Nothing happens if `root`'s pid now names another process.
    """
    root_pid = root.pid
    stopped: dict[int, ProcRef] = {}
    for _ in range(rounds):
        if ref(root_pid) != root:
            break  # gone (or reused): its former tree is no longer ours to find
        new = [r for p in [root_pid, *descendants(root_pid)]
               if p not in stopped and (r := ref(p)) is not None]
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        stopped.update((r.pid, r) for r in new)
    refs = list(stopped.values())
    _signal(refs, signal.SIGKILL)
    late: list[ProcRef] = []
    if ref(root_pid) == root:  # (a zombie root keeps its identity until reaped)
        late = [r for p in descendants(root_pid) if (r := ref(p)) is not None]
        _signal(late, signal.SIGKILL)
    return refs + late


def reap(refs: Sequence[ProcRef]) -> int:
    """waitpid() those of `refs` that are zombie children of ours; returns how many."""
    n = 0
    for r in refs:
        st = _stat(r.pid)
        if st is None or st[0] != "Z" or st[1] != r.start:
            continue
        try:
            done, _ = os.waitpid(r.pid, os.WNOHANG)
            n += bool(done)
        except ChildProcessError:
            pass  # not our child: its own parent reaps it
    return n
