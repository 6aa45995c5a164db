"""`rollstack node doctor`: what rollstack left on this host under node roots, and reclaiming it.

Scope is a node root and what is tied to it, nothing else: mounts below the root, the lazy store
daemon serving `<root>/lazy/mnt` and the fd-holder of `<root>/lazy/state` (found by their
command lines), the FUSE connection of a mount below the root, runc containers of
`<root>/runc`, environment state dirs `<root>/envs/<id>` (warm sandboxes are environments
too), their cgroups `<hierarchy>/rollstack/<id>`, the node's background cgroup
(`rollstack-background-<tag>`), network slots claimed as `<root>:...`, recovery records
`<root>/node-envs/`, a dead agent's pid file. Caches (lazy/state, layers/, resolve-cache/) and the
token are the node's to keep, not leftovers.

A root whose agent lives (its `agent.lock` is held, or an agent process serving it runs) is
reported as one `agent` finding that `--fix` never touches: everything under it is that
agent's. An in-process node (`rollstack.client.Node`) holds no lock: do not doctor its root
while it runs.

`scan` reads (every read of the root is bounded by `SCAN_TIMEOUT`, and whether a FUSE mount
answers is asked in a child process bounded by `PROBE_TIMEOUT`: a hung mount hangs that child,
never the doctor), `findings` turns what was read into `Finding`s (pure), `fix` reclaims each
root the way node start's recovery does (`node.recovery.adopt_or_clean`,
`end_orphan_daemon`), each step bounded by `STEP_TIMEOUT`, then scans again: a finding is fixed
when the second scan no longer has it, so `fix` is idempotent and a second run finds nothing.
A FUSE connection whose daemon is gone is aborted (`/sys/fs/fuse/connections/<dev>/abort`)
before anything else touches the root, so no step blocks on it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

log = logging.getLogger(__name__)

SCAN_TIMEOUT = 30.0
"""Seconds one root's scan may take before it is reported as a `timeout` finding."""
PROBE_TIMEOUT = 3.0
"""Seconds a FUSE mount has to answer statvfs before it counts as hung."""
STEP_TIMEOUT = 120.0
"""Seconds one reclaim step of one root may take (destroying its environments is one step)."""
FUSE_CONNECTIONS = Path("/sys/fs/fuse/connections")


@dataclass(frozen=True)
class Finding:
    """One thing rollstack owns on this host that is left (or, kind `agent`, still running)."""

    kind: str
    """agent | file | daemon | holder | fuse | mount | container | environment | cgroup | netns |
    record | timeout"""
    root: str
    """The node root it belongs to."""
    target: str
    """What it is: a path (mounts, dirs, cgroups), a pid, a container/environment id, a netns."""
    detail: str
    """One line for a person."""
    fixable: bool = True
    """`fix` reclaims it (False: a running agent, a check that timed out)."""

    def key(self) -> tuple[str, str, str]:
        return (self.root, self.kind, self.target)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FixResult:
    """What `fix` did about one fixable finding: gone on the second scan, or not (and why)."""

    kind: str
    root: str
    target: str
    ok: bool
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RootFacts:
    """What a scan read about one root (the input of the pure `findings`)."""

    root: str
    state: str = "absent"
    """absent (no such dir) | running (a live agent holds it) | stopped | foreign (a dir that
    is not a node root, e.g. `/`: nothing under it is listed or touched)"""
    agent_pid: int | None = None
    agent_url: str | None = None
    stale_pid_file: bool = False
    daemons: list[int] = field(default_factory=list)
    holders: list[int] = field(default_factory=list)
    mounts: list[tuple[str, str]] = field(default_factory=list)
    """(mount point, fs type) of every mount below the root, in mount order."""
    fuse: dict[str, str] = field(default_factory=dict)
    """FUSE mount point below the root -> ok | dead | hung (`probe`)."""
    containers: list[str] = field(default_factory=list)
    envs: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    slots: dict[int, str] = field(default_factory=dict)
    """Network slot -> its claim's owner (`<root>:<env-id>` or `<root>:warm`)."""
    records: list[str] = field(default_factory=list)
    forks: list[str] = field(default_factory=list)
    """Frozen layers under `<root>/forks` (rollstack.node.forks): with no agent, none is in use."""
    timeouts: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"path": self.root, "state": self.state, "pid": self.agent_pid, "url": self.agent_url}


# -- pure: facts -> findings ---------------------------------------------------------------------

def findings(facts: RootFacts) -> list[Finding]:
    """What is left under one root, in the order `fix` reclaims it."""
    r = facts.root
    out = [Finding("timeout", r, what, f"{what} did not answer within its timeout", fixable=False)
           for what in facts.timeouts]
    if facts.state == "running":
        return out + [Finding("agent", r, str(facts.agent_pid or "?"),
                              f"node agent pid {facts.agent_pid or '?'} serving {facts.agent_url or '?'} holds "
                              f"this root: not reclaimed; stop it first (rollstack node stop --root {r})",
                              fixable=False)]
    mnt = f"{r}/lazy/mnt"
    for mp, status in facts.fuse.items():
        if status != "ok" or not facts.daemons:
            why = {"hung": "does not answer", "dead": "has no daemon (ENOTCONN)"}.get(status, "has no daemon")
            out.append(Finding("fuse", r, mp, f"FUSE connection that {why}: aborted by --fix"))
    out += [Finding("container", r, c, f"runc container (state in {r}/runc)") for c in facts.containers]
    out += [Finding("environment", r, e, f"environment state dir {r}/envs/{e}") for e in facts.envs]
    out += [Finding("cgroup", r, cg, "the node's background cgroup" if "/rollstack-background-" in cg
                    else f"cgroup of environment {Path(cg).name}") for cg in facts.cgroups]
    out += [Finding("daemon", r, str(p), f"lazy store daemon serving {mnt} with no agent") for p in facts.daemons]
    out += [Finding("holder", r, str(p), f"fd-holder keeping the FUSE connection of {mnt}") for p in facts.holders]
    out += [Finding("netns", r, f"rsn-{slot}", f"network slot {slot} claimed by {owner}")
            for slot, owner in sorted(facts.slots.items())]
    out += [Finding("mount", r, mp, f"{fstype} mount") for mp, fstype in reversed(facts.mounts)]
    out += [Finding("record", r, rec, f"recovery record {r}/node-envs/{rec}") for rec in facts.records]
    out += [Finding("fork", r, name, f"fork layer {r}/forks/{name}") for name in facts.forks]
    if facts.stale_pid_file:
        out.append(Finding("file", r, f"{r}/agent.pid", "pid file of an agent that is gone"))
    return out


def report(roots: Sequence[RootFacts], found: Sequence[Finding], fixed: Sequence[FixResult] = (),
           remaining: Sequence[Finding] | None = None) -> dict[str, Any]:
    """The `--json` document: clean when nothing is left (after `fix`, when it ran)."""
    left = found if remaining is None else remaining
    doc: dict[str, Any] = {"roots": [f.summary() for f in roots], "findings": [f.to_dict() for f in found],
                           "fixed": [x.to_dict() for x in fixed], "clean": not left}
    if remaining is not None:
        doc["remaining"] = [f.to_dict() for f in remaining]
    return doc


def agent_root(argv: Sequence[bytes]) -> str | None:
    """The root of a node agent process (`python -m rollstack.node.agent serve CONFIG_JSON`), or None."""
    if b"rollstack.node.agent" not in argv or b"serve" not in argv:
        return None
    rest = argv[argv.index(b"serve") + 1:]
    try:
        doc = json.loads(rest[0]) if rest else None
    except ValueError:
        return None
    root = doc.get("root", "/var/lib/rollstack") if isinstance(doc, dict) else None
    return os.path.abspath(root) if isinstance(root, str) else None


def connection_id(device: tuple[int, int]) -> int:
    """The kernel's name of a FUSE connection under /sys/fs/fuse/connections: its superblock's dev_t."""
    major, minor = device
    return (major << 20) | minor


def under(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


# -- reading the host -----------------------------------------------------------------------------

def bounded(fn: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """Run `fn` on a daemon thread for at most `timeout` s: (True, result) or (False, None);
    its exception is re-raised. A thread stuck on a hung mount is left behind, not waited for."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = exc

    t = threading.Thread(target=run, name="rollstack-doctor", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("value")


def probe(mount_point: str, timeout: float = PROBE_TIMEOUT) -> str:
    """'ok', 'dead' (statvfs fails, e.g. ENOTCONN) or 'hung': asked by `stat -f` in a child."""
    try:
        proc = subprocess.Popen(["stat", "-f", "--", mount_point], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return "hung"
    try:
        return "ok" if proc.wait(timeout) == 0 else "dead"
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: left to exit when its request is aborted
        return "hung"


def _agent_pids(root: str) -> list[int]:
    from rollstack.lazystore.recovery import processes

    def serves(argv: list[bytes]) -> bool:
        named = agent_root(argv)
        return named is not None and (named == root or os.path.realpath(named) == root)

    return [pid for pid, argv in processes() if pid != os.getpid() and serves(argv)]


def _agent(facts: RootFacts) -> None:
    from rollstack.node import agent
    from rollstack.node.config import NodeConfig

    cfg = NodeConfig(root=Path(facts.root))
    pids = _agent_pids(facts.root)
    held = agent.root_held(cfg)
    if held or pids:
        doc = agent.holder(cfg)
        facts.state, facts.agent_pid = "running", pids[0] if pids else doc.get("pid")
        facts.agent_url = doc.get("url")
        return
    facts.state = "stopped"
    facts.stale_pid_file = cfg.pid_path.exists()
    from rollstack.node.forks import layer_names

    facts.forks = layer_names(Path(facts.root) / "forks")


def _read_root(facts: RootFacts, probe_timeout: float) -> None:
    from rollstack.host import mountinfo
    from rollstack.lazystore import holder
    from rollstack.lazystore.config import daemon_pids
    from rollstack.run.environment import find_leftovers

    root = Path(facts.root)
    _agent(facts)
    if facts.state == "running":
        return
    facts.daemons = daemon_pids(root / "lazy" / "mnt")
    facts.holders = holder.pids(root / "lazy" / "state")
    facts.mounts = [(m.mount_point, m.fstype) for m in mountinfo.read() if under(m.mount_point, facts.root)]
    facts.fuse = {mp: probe(mp, probe_timeout) for mp, t in facts.mounts if t.startswith("fuse")}
    if (root / "envs").is_dir() or (root / "runc").is_dir():  # the runtime would make both
        left = find_leftovers(root)
        facts.containers, facts.envs, facts.cgroups = left.containers, left.envs, list(left.cgroups)
    facts.cgroups += [str(d) for d in _background_cgroups(facts.root)]
    facts.slots = _slots(facts.root)
    records = root / "node-envs"
    facts.records = sorted(p.name for p in records.iterdir()) if records.is_dir() else []


def _background_cgroups(root: str) -> list[Path]:
    from rollstack.host.background import PREFIX
    from rollstack.host.cgroups import cgroup_mounts
    from rollstack.node.stages import _node_tag

    name = PREFIX + _node_tag(Path(root))
    return [Path(mp) / name for mp, _ in cgroup_mounts() if (Path(mp) / name).is_dir()]


def _slots(root: str) -> dict[int, str]:
    from rollstack.run.network import NetworkManager

    slots = NetworkManager().state_dir / "slots"
    out: dict[int, str] = {}
    for p in slots.glob("*") if slots.is_dir() else []:
        try:
            owner = str(json.loads(p.read_text()).get("owner", ""))
        except (OSError, ValueError, AttributeError):
            continue
        if owner.startswith(root + ":") and p.name.isdigit():
            out[int(p.name)] = owner
    return out


NODE_MARKS = ("agent.lock", "token", "envs", "lazy", "runc", "node-envs")
"""What a node root holds once an agent or a runtime used it (node/config.py, node/agent.py)."""


def is_node_root(root: str) -> bool:
    """A node root, or an empty dir: never `/`, nor a dir of other things, whose mounts
    `--fix` would otherwise detach."""
    if root == "/":
        return False
    try:
        names = os.listdir(root)
    except OSError:
        return False
    return not names or any(n in NODE_MARKS for n in names)


def scan_root(root: Path | str, timeout: float = SCAN_TIMEOUT, probe_timeout: float = PROBE_TIMEOUT) -> RootFacts:
    """What is left under `root` (resolved), read within `timeout` seconds."""
    facts = RootFacts(os.path.realpath(root))
    if not os.path.isdir(facts.root):
        return facts
    if not is_node_root(facts.root):
        facts.state = "foreign"
        return facts
    done, _ = bounded(lambda: _read_root(facts, probe_timeout), timeout)
    if not done:
        facts.timeouts.append(f"scan of {facts.root}")
    return facts


def scan(roots: Iterable[Path | str], timeout: float = SCAN_TIMEOUT) -> tuple[list[RootFacts], list[Finding]]:
    """Every root's facts, and what is left under them."""
    facts = [scan_root(r, timeout) for r in dict.fromkeys(os.path.realpath(r) for r in roots)]
    return facts, [f for rf in facts for f in findings(rf)]


# -- reclaiming -----------------------------------------------------------------------------------

def fix(found: Sequence[Finding], timeout: float = STEP_TIMEOUT) -> tuple[list[FixResult], list[Finding]]:
    """Reclaim the roots of the fixable findings; (one result per fixable finding, what is
    left: the findings of a second scan of the same roots)."""
    roots = list(dict.fromkeys(f.root for f in found if f.fixable))
    errors = {root: reclaim(root, timeout) for root in roots}
    _, after = scan(dict.fromkeys(f.root for f in found))
    left = {f.key() for f in after}
    results = []
    for f in found:
        if f.fixable:
            ok = f.key() not in left
            results.append(FixResult(f.kind, f.root, f.target, ok, None if ok else "; ".join(errors[f.root]) or "still there"))
    return results, after


def reclaim(root: str, timeout: float = STEP_TIMEOUT) -> list[str]:
    """Reclaim everything a stopped node left under `root`, in recovery's order; the errors."""
    facts = RootFacts(root)
    if not is_node_root(root):
        return [f"{root} is not a node root"]
    _agent(facts)
    if facts.state == "running":  # it may have started since the scan
        return [f"a node agent (pid {facts.agent_pid}) holds {root}"]
    errors: list[str] = []
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("abort dead FUSE connections", lambda: _abort_dead(root)),
        ("destroy environments", lambda: _destroy_envs(root)),
        ("end the lazy store daemon", lambda: _end_daemon(root)),
        ("end fd-holders", lambda: _end_holders(root)),
        ("release network slots", lambda: _release_slots(root)),
        ("unmount", lambda: _unmount_all(root)),
        ("remove background cgroups", lambda: [_remove_cgroup(d) for d in _background_cgroups(root)]),
        ("remove the stale pid file", lambda: (Path(root) / "agent.pid").unlink(missing_ok=True)),
        ("remove fork layers", lambda: shutil.rmtree(Path(root) / "forks", ignore_errors=True)),
    ]
    for name, step in steps:
        try:
            done, _ = bounded(step, timeout)
            if not done:
                errors.append(f"{name}: timed out after {timeout:.0f}s")
        except Exception as exc:  # noqa: BLE001 - the next steps still run; the rescan reports what is left
            log.warning("doctor: %s under %s failed: %s", name, root, exc)
            errors.append(f"{name}: {exc}")
    return errors


def _fuse_mounts(root: str) -> list[str]:
    from rollstack.host import mountinfo

    return [m.mount_point for m in mountinfo.read() if m.fstype.startswith("fuse") and under(m.mount_point, root)]


def abort_connection(mount_point: str) -> bool:
    """Abort the FUSE connection of the mount at `mount_point` (its waiting and future requests
    fail at once); True if it was written. The mount itself stays until it is detached."""
    from rollstack.host import mountinfo

    dev = mountinfo.devices().get(mount_point)
    if dev is None:
        return False
    try:
        (FUSE_CONNECTIONS / str(connection_id(dev)) / "abort").write_text("1")
    except OSError:
        return False
    log.warning("doctor: aborted the FUSE connection of %s", mount_point)
    return True


def _abort_dead(root: str) -> None:
    """Abort the connections of FUSE mounts below `root` that do not answer or whose daemon is gone."""
    from rollstack.lazystore.config import daemon_pids

    serving = bool(daemon_pids(Path(root) / "lazy" / "mnt"))
    for mp in _fuse_mounts(root):
        if not serving or probe(mp) != "ok":
            abort_connection(mp)


def _destroy_envs(root: str) -> None:
    from rollstack.node import recovery
    from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig

    runtime = EnvironmentRuntime(RuntimeConfig(root=Path(root), subreaper=False))
    recovery.adopt_or_clean(runtime, recovery.load_records(Path(root)), can_adopt=False)


def _end_daemon(root: str) -> None:
    from rollstack.node.recovery import end_orphan_daemon

    end_orphan_daemon(Path(root) / "lazy" / "mnt", Path(root) / "lazy" / "state")


def _end_holders(root: str) -> None:
    from rollstack.lazystore import holder

    for pid in holder.pids(Path(root) / "lazy" / "state"):  # matched by their socket under root
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _release_slots(root: str) -> None:
    from rollstack.run.network import NetworkManager

    NetworkManager().reclaim(root + ":")


def _unmount_all(root: str) -> None:
    """Detach every mount below `root`, last mounted first; a FUSE one's dead connection is
    aborted first. By the mount point as mountinfo names it: never a realpath, which would
    stat a hung mount."""
    import errno

    from rollstack.host import libc, mountinfo
    from rollstack.host.umount import MNT_DETACH

    for _ in range(8):  # stacked mounts: each pass detaches the top of every stack
        left = [m for m in mountinfo.read() if under(m.mount_point, root)]
        if not left:
            return
        for m in reversed(left):
            if m.fstype.startswith("fuse") and probe(m.mount_point) != "ok":
                abort_connection(m.mount_point)
            err = libc.umount2(m.mount_point, MNT_DETACH)
            if err not in (0, errno.EINVAL, errno.ENOENT):
                raise OSError(err, f"detaching {m.mount_point}: {os.strerror(err)}")


def _remove_cgroup(cg: Path) -> None:
    from rollstack.run.cgroupfs import remove_cgroup

    remove_cgroup(cg)
