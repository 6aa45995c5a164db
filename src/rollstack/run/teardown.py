"""Tearing one environment down: kill PID 1, reap, runc state, cgroups, network, unmount, dirs.

`destroy` undoes `EnvironmentRuntime.create` in reverse and tolerates any prefix of it having
happened, so it is idempotent and is also what crash recovery runs. `kill_init` is the cheap,
immediate part of an asynchronous destroy.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import TYPE_CHECKING

from rollstack.errors import RuntimeFailure
from rollstack.host.tree import remove_tree
from rollstack.host import fdwait
from rollstack.run import cgroupfs, overlay, procs
from rollstack.run import userns as uns

if TYPE_CHECKING:
    from rollstack.run.handle import Environment


def kill_init(env: "Environment") -> bool:
    """SIGKILL the environment's PID 1 without runc (the kernel then ends its whole pid
    namespace); cheap, for asynchronous destroys. True if sent."""
    return signal_init(env, signal.SIGKILL)


def signal_init(env: "Environment", sig: int) -> bool:
    """Send `sig` to the environment's PID 1, only if that process is still in this
    environment's cgroup (through a pidfd: no pid-reuse race). True if sent."""
    with env.pinned_init() as pinned:
        if pinned is None:
            return False
        try:
            signal.pidfd_send_signal(pinned[1], sig)
            return True
        except OSError:
            return False

def destroy(env: "Environment") -> None:
    """Kill, runc delete, remove cgroups, unmount, remove the state dir. Idempotent."""
    runc, errors = env.engine, []
    init_pid = env._init_pid()
    if runc.has_state(env.id):
        # kill + wait + plain delete: `runc delete --force` sleeps >= 100 ms polling.
        members = _members(env)
        if not kill_init(env):  # PID 1 through a pidfd: no runc process needed
            try:
                runc.kill(env.id, "KILL")
            except RuntimeFailure:
                pass  # not running any more: delete below handles it
        exited = init_pid is not None and wait_exit(init_pid, members)
        if exited and env.runtime_name == "runc":
            # init (and so its whole pid namespace) is dead: what `runc delete` would still
            # do is remove its state dir (cgroups are removed below); skip that Go process
            shutil.rmtree(runc.root / env.id, ignore_errors=True)
    if runc.has_state(env.id):  # runsc keeps `<id>_sandbox:*` files, not a dir
        try:
            runc.delete(env.id)
        except RuntimeFailure:
            try:
                runc.delete(env.id, force=True)
            except RuntimeFailure as e:
                errors.append(str(e))
                runc.drop_state(env.id)
    if init_pid is not None:
        reap(init_pid, wait=0)
    below = env.runtime.config.release_page_cache_below
    for cg in cgroupfs.env_cgroup_dirs(env.id, env.runtime.config.cgroup_parent):
        try:
            if below > 0:  # processes are gone: what is charged is page cache only
                cgroupfs.release_page_cache(cg, below)
            cgroupfs.remove_cgroup(cg)
        except OSError as e:
            errors.append(f"cgroup {cg}: {e}")
    net, net_left = env.net, False
    if net is not None:
        try:
            env.runtime.network.teardown(net)
        except RuntimeFailure as e:
            errors.append(str(e))
            net_left = True  # keep meta.json: it is how a retry finds the slot
    try:
        uns.unpublish_rootfs(env.dir)
        overlay.unmount(env.rootfs)
    except RuntimeFailure as e:
        errors.append(str(e))
    idmaps = sorted((env.dir / "idmap").glob("*")) if (env.dir / "idmap").is_dir() else []
    for d in idmaps:  # userns: the idmapped lower clones, after the overlay over them
        try:
            overlay.unmount(d)
        except RuntimeFailure as e:
            errors.append(str(e))
    if any(overlay.is_mounted(d) for d in idmaps):
        net_left = True  # never rmtree through a mount
    if env.dir.exists() and not overlay.is_mounted(env.rootfs) and not net_left:
        remove_tree(env.dir)  # any depth: an environment's upper can be deeper than rmtree goes
    if env.dir.exists() or errors:
        raise RuntimeFailure(f"destroy of {env.id} incomplete: {'; '.join(errors)}",
                             errors=errors)

def _members(env: "Environment") -> list[procs.ProcRef]:
    """The environment's processes (from its cgroups), for reaping during teardown."""
    refs: dict[int, procs.ProcRef] = {}
    for cg in cgroupfs.env_cgroup_dirs(env.id, env.runtime.config.cgroup_parent):
        for pid in cgroupfs.cgroup_procs(cg):
            if pid not in refs and (r := procs.ref(pid)) is not None:
                refs[pid] = r
    return list(refs.values())


def wait_exit(pid: int, members: list[procs.ProcRef], timeout: float = 2.0) -> bool:
    """Block until `pid` has exited (zombie or gone), at most `timeout` seconds; True if it did.

    Meanwhile reap any of the environment's `members` that were re-parented to us: the init
    cannot finish exiting while a member of its pid namespace is an unreaped zombie.
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return True  # already gone
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            procs.reap(members)
            if fdwait.wait([fd], 0.01):
                return True
        return False
    finally:
        os.close(fd)


def reap(pid: int, wait: float = 2.0) -> None:
    """Collect `pid` if it is our (dead or dying) child; no-op for anyone else's process."""
    end = time.monotonic() + wait
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() >= end:
            return
        time.sleep(0.01)
