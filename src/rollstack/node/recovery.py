"""Recovery after a crashed agent, the node's part: the lazy store daemon it left behind.

The runtime's leftovers (env dirs, runc state, overlay mounts, cgroups) are found and destroyed by
`EnvironmentRuntime.cleanup_leftovers()`; this module ends a lazy store daemon still serving the
node's mountpoint (it runs in its own session, so it outlives a crashed agent), so that the new
daemon never stacks on it, nor gets unmounted by the old one's exit.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from rollstack.host import atomic

log = logging.getLogger(__name__)


def daemon_pids(mountpoint: Path) -> list[int]:
    """Pids of lazy store daemons serving `mountpoint` (found by their command line)."""
    from rollstack.lazystore.config import daemon_pids as serving

    return serving(mountpoint)


def end_orphan_daemon(mountpoint: Path, state_dir: Path, wait: float = 10.0) -> None:
    """End a lazy store daemon a crashed agent left serving `mountpoint` (its environments are
    already destroyed), so the new daemon never stacks on it or gets unmounted by its exit."""
    from rollstack.lazystore.client import LazyStoreClient

    pids = daemon_pids(mountpoint)
    if not pids:
        return
    log.warning("ending lazy store daemon(s) %s left at %s by a previous run", pids, mountpoint)
    LazyStoreClient.connect(mountpoint, state_dir).stop()  # asks it to unmount and exit
    deadline = time.monotonic() + wait
    while daemon_pids(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in daemon_pids(mountpoint):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- re-adoption ---------------------------------------------------------------------------------
#
# The service writes `<root>/node-envs/<id>.json` (plan, timeout, start time) once an environment
# is running and removes it on destroy. After a crash, an environment can be re-adopted when its
# record exists, runc still runs it, and the old lazy store daemon still serves its lower dirs
# (an overlay keeps the superblock it was mounted on: a new daemon cannot replace the old one
# under a live mount). Everything else is destroyed.

RECORDS_DIR = "node-envs"


def _records_dir(root: Path) -> Path:
    return Path(root) / RECORDS_DIR


def save_record(root: Path, env_id: str, doc: dict) -> None:
    import json

    d = _records_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    atomic.replace(d / f"{env_id}.json", json.dumps(doc).encode())  # a reserved tmp if any


def reserve_record(root: Path, env_id: str) -> None:
    """Make the tmp inode of `env_id`'s record now (host.atomic): a warm sandbox, whose handout
    saves the record under the sandbox's id, then allocates no inode for it."""
    d = _records_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    atomic.reserve(d / f"{env_id}.json")


def drop_record(root: Path, env_id: str) -> None:
    path = _records_dir(root) / f"{env_id}.json"
    path.unlink(missing_ok=True)
    atomic.discard(path)


def load_records(root: Path) -> dict[str, dict]:
    import json

    out: dict[str, dict] = {}
    d = _records_dir(root)
    if not d.is_dir():
        return out
    for p in d.glob("*.json"):
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, ValueError):
            p.unlink(missing_ok=True)
    for p in d.glob(".*.tmp"):  # a crashed writer's, or an unused reservation (warm sandboxes die with the node)
        p.unlink(missing_ok=True)
    return out


def _as_found(env, doc: dict) -> dict | None:
    """The record of a mounted environment corrected by what is on the machine (its container's
    state and checkpoint), or None when there is nothing to adopt. The agent may have died at any
    step: in a fork's cut (the container frozen, the record not paused: thawed here), between a
    checkpoint and its record (the images and meta.json say so), or between a restore and its
    record (the processes run again: adopted running, the images removed)."""
    from rollstack.host.tree import remove_tree
    from rollstack.run import checkpoint

    status = env.status()
    if status == "paused" and not doc.get("paused"):
        env.resume()  # frozen by a cut the crash interrupted
        status = "running"
    def checkpointed() -> bool:  # meta.json is read only where it is needed, once per path
        return bool(doc.get("checkpointed")) or checkpoint.is_checkpointed(env)

    if status in ("running", "paused"):
        if checkpointed():
            checkpoint.forget(env)
            remove_tree(env.dir / checkpoint.IMAGES_DIR)
            doc = {**doc, "paused": status == "paused"}
            doc.pop("checkpointed", None)
        return doc
    if (env.dir / checkpoint.IMAGES_DIR).is_dir() and checkpointed():
        return {**doc, "paused": True, "checkpointed": True}  # its processes are on disk
    return None


def adopt_or_clean(runtime, records: dict[str, dict], can_adopt: bool) -> tuple[list, object]:
    """Re-open the running environments that have a record (if `can_adopt`), destroy the rest.

    Returns `([(Environment, record), ...], Leftovers found)`.
    """
    from rollstack.run import overlay
    from rollstack.run.environment import Environment

    left = runtime.find_leftovers()
    adopted = []
    if can_adopt:
        for env_id in left.envs:
            doc = records.get(env_id)
            if doc is None:
                continue
            try:
                env = runtime.open(env_id)
                doc = _as_found(env, doc) if overlay.is_mounted(env.rootfs) else None
            except Exception:  # noqa: BLE001 - half built or half destroyed when the agent died:
                # cleaned up below like any other leftover; one environment never stops a start
                log.warning("environment %s cannot be re-adopted; cleaning it up", env_id, exc_info=True)
                continue
            if doc is not None:
                adopted.append((env, doc))
    keep = {env.id for env, _ in adopted}
    for env_id in sorted((set(left.envs) | set(left.containers)) - keep):
        try:
            Environment(runtime, env_id).destroy()
        except Exception:  # noqa: BLE001 - recovery goes on; the next start tries again
            log.exception("cleaning up leftover environment %s failed", env_id)
    kept_dirs = [str(runtime.env_dir(k)) + "/" for k in keep]
    for mp in reversed(left.mounts):
        if not any(mp.startswith(d) for d in kept_dirs):
            overlay.unmount(Path(mp))
    for env_id in set(records) - keep:
        drop_record(runtime.root, env_id)
    return adopted, left
