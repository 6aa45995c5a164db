"""The cgroup tree rollstack owns: where an environment's cgroup is, and its OOM-kill counter.

Every environment's cgroup is `<hierarchy>/rollstack/<env-id>` (`CGROUP_PARENT`): under each
v1 controller (and named v1 hierarchies), under the v2 unified root. runc creates them, the
provisioner writes their quotas, the node reads the OOM counter after every exec.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rollstack.errors import RuntimeFailure
from rollstack.host import mountinfo

CGROUP_PARENT = "rollstack"
OOM_COUNTER_FILES = ("memory.oom_control", "memory.events")
"""v1 `memory.oom_control` and v2 `memory.events` both carry an `oom_kill N` line."""


def env_cgroup(env_id: str, parent: str = CGROUP_PARENT) -> str:
    """The environment's cgroup path relative to a hierarchy root (`rollstack/<env-id>`)."""
    return f"{parent.strip('/')}/{env_id}"


def cgroup_mounts(text: str | None = None) -> list[tuple[str, str]]:
    """(mount point, "cgroup" | "cgroup2") of every cgroup hierarchy mounted here (of `text`, a
    mountinfo table, if given). This host's are read once per process (`_host_cgroup_mounts`)."""
    if text is not None:
        return _of(text)
    return list(_host_cgroup_mounts())


def _of(text: str | None) -> list[tuple[str, str]]:
    return [(m.mount_point, m.fstype) for m in mountinfo.of_types(("cgroup", "cgroup2"), text)]


_HOST_MOUNTS: tuple[tuple[str, str], ...] = ()


def _host_cgroup_mounts() -> tuple[tuple[str, str], ...]:
    """This host's hierarchies, read once per process. They are mounted at boot (systemd, or
    scripts/setup-system.sh before a node starts) and stay while the node runs; reading
    mountinfo for them cost 0.7 ms per call at 600 overlay mounts, and a create, the first exec
    of an environment and its destroy each asked (docs/runtime.md, "Mount checks"). None found
    is not kept (a later call reads again); a process that mounts one calls `forget_mounts()`."""
    global _HOST_MOUNTS
    if not _HOST_MOUNTS:
        _HOST_MOUNTS = tuple(_of(None))
    return _HOST_MOUNTS


def forget_mounts() -> None:
    """Read the host's cgroup hierarchies again on the next call (after mounting one)."""
    global _HOST_MOUNTS
    _HOST_MOUNTS = ()


def env_cgroup_dirs(env_id: str, parent: str = CGROUP_PARENT,
                    mounts: list[tuple[str, str]] | None = None) -> list[Path]:
    """Every existing cgroup dir of `env_id` (one per hierarchy that has it)."""
    mounts = cgroup_mounts() if mounts is None else mounts
    rel = env_cgroup(env_id, parent)
    return [Path(mp) / rel for mp, _ in mounts if (Path(mp) / rel).is_dir()]


def stat_value(text: str, *keys: str) -> int | None:
    """The first of `keys` found in a `memory.stat` text (`key value` lines), else None."""
    values = dict(line.partition(" ")[::2] for line in text.splitlines())
    for key in keys:
        try:
            return int(values[key])
        except (KeyError, ValueError):
            continue
    return None


def oom_kill_count(text: str | bytes) -> int:
    """The `oom_kill N` value of a memory.oom_control / memory.events text (0 when absent)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def oom_counter_file(env_id: str, parent: str = CGROUP_PARENT) -> Path | None:
    """The file that counts the environment's OOM kills (for callers that re-read it), or None."""
    rel = env_cgroup(env_id, parent)
    # the memory hierarchy (v1) or the unified one (v2) first: no walk of every controller
    mounts = sorted(cgroup_mounts(), key=lambda m: not (m[1] == "cgroup2" or m[0].endswith("/memory")))
    for mp, _ in mounts:
        for name in OOM_COUNTER_FILES:
            path = f"{mp}/{rel}/{name}"
            if os.path.exists(path):
                return Path(path)
    return None


def oom_kills(env_id: str, parent: str = CGROUP_PARENT) -> int:
    """How many processes the kernel's OOM killer ended in this environment's memory cgroup."""
    path = oom_counter_file(env_id, parent)
    if path is None:
        return 0
    try:
        return oom_kill_count(path.read_text())
    except OSError:
        return 0


FREEZE_TIMEOUT = 30.0


def freezer_file(env_id: str, parent: str = CGROUP_PARENT) -> Path | None:
    """The environment's freezer control: v1 `freezer.state` or v2 `cgroup.freeze`, or None."""
    rel = env_cgroup(env_id, parent)
    for mp, fstype in cgroup_mounts():
        name = "cgroup.freeze" if fstype == "cgroup2" else "freezer.state"
        path = Path(mp) / rel / name
        if path.exists():
            return path
    return None


def task_states(cgroup_dir: Path, limit: int = 16) -> str:
    """`pid comm state wchan` of the cgroup's first `limit` tasks (what a freeze waits for)."""
    try:
        pids = (cgroup_dir / "cgroup.threads").read_text().split() if (cgroup_dir / "cgroup.threads").exists() \
            else (cgroup_dir / "tasks").read_text().split()
    except OSError as exc:
        return f"(tasks unreadable: {exc})"
    out = []
    for pid in pids[:limit]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
        out.append(f"{pid} {comm} {state} {wchan}")
    return "; ".join(out) + (f"; ... {len(pids) - limit} more" if len(pids) > limit else "")


def set_frozen(control: Path, frozen: bool, timeout: float = FREEZE_TIMEOUT) -> None:
    """Freeze (or thaw) every process of the cgroup and wait until the kernel says it is done
    (v1 `freezer.state` reads FROZEN / THAWED; v2 `cgroup.events` says `frozen 1` / `0`)."""
    v2 = control.name == "cgroup.freeze"
    control.write_text(("1" if frozen else "0") if v2 else ("FROZEN" if frozen else "THAWED"))
    deadline = time.monotonic() + timeout
    while True:
        if v2:
            state = stat_value((control.parent / "cgroup.events").read_text(), "frozen")
            done = state == (1 if frozen else 0)
        else:
            done = control.read_text().strip() == ("FROZEN" if frozen else "THAWED")
        if done:
            return
        if time.monotonic() > deadline:
            tasks = task_states(control.parent)  # before the thaw: who held the freeze up
            if frozen:  # never leave it half frozen (FREEZING): thaw what was frozen so far
                control.write_text("0" if v2 else "THAWED")
            raise RuntimeFailure(f"{control} did not become {'frozen' if frozen else 'thawed'} in {timeout:.0f} s "
                                 f"(a process stuck in the kernel, e.g. on I/O): {tasks}", path=str(control))
        time.sleep(0.001)
