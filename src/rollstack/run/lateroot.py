"""Late-bound roots: sandboxes started before the root they will run on exists.

A fork's children run on the parent's changes frozen at the cut, which exist only from the cut
on; a cold start per child (`runc run`: ~35-50 ms of mostly CPU here, 8 at once 3-3.5x one) is
what made fork(8) cost 2.3-3.4x fork(1). A late-bound sandbox is started ahead instead and gets
its root at handout:

1. `start`: the environment's dir as for a create, but `<env>/rootfs` stays an empty dir, bound
   onto itself and made a shared mount of a peer group of its own; runc starts PID 1
   (rollstack-execd) on it with the environment's full spec (namespaces, capabilities, seccomp,
   cgroup, user namespace, masked and read-only paths): the container's root is a slave of that
   mount. runc leaves its mount points (proc, dev, sys, .rollstack/*) in the empty dir.
2. `bind`: the node mounts the child's overlay at `<env>/rootfs`; it propagates into the
   container, stacked over its root, where no process sees it. What a create writes before
   `runc run` is written now (the mutation, through the host-side merged view). Then
   rollstack-rootswitch (native/rootswitch) joins the container's mount namespace through a
   pidfd of PID 1 and pivots it onto the overlay, moving the spec's top-level mounts (/proc,
   /dev, /sys with their submounts; the /.rollstack binds) over, after making the tree private.

Afterwards the container is what a cold create makes: the same config.json and runc state (the
root path is `<env>/rootfs` for both), namespaces, cgroup and PID 1; its mount tree differs in
propagation only (private throughout, where a cold one's root is a slave of the host's overlay
mount). The host side is a create's too, with the self-bind under the overlay (teardown unmounts
every mount stacked at `<env>/rootfs`). Which plans: what the warm pool serves (runc, the node's
default user namespace choice, no network namespace, no volumes: `rollstack.node.warm.eligible`).
A failed switch leaves a sandbox that is only destroyed; the caller creates cold.
"""

from __future__ import annotations

import functools
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.host import libc
from rollstack.run import overlay
from rollstack.run import userns as uns
from rollstack.run.handle import Environment
from rollstack.run.initbin import find_native
from rollstack.run.ocispec import SpecParams, build_spec

if TYPE_CHECKING:
    from rollstack.run.runtime import EnvironmentRuntime

ROOTSWITCH_NAME = "rollstack-rootswitch"
UNBOUND = "unbound"
"""meta.json's `late_root` while the sandbox waits for its root (then "bound")."""
_MS_PRIVATE, _MS_SHARED = 1 << 18, 1 << 20
SWITCH_TIMEOUT_S = 30.0


@functools.cache
def rootswitch() -> str | None:
    """The static rollstack-rootswitch binary (`make setup` builds it), or None."""
    return find_native(ROOTSWITCH_NAME)


def available(rt: "EnvironmentRuntime") -> bool:
    """This node can start late-bound sandboxes: the switch is built and PID 1 is the agent."""
    return rootswitch() is not None and rt.uses_agent


def unbound(env: Environment) -> bool:
    return env.meta().get("late_root") == UNBOUND


def start(rt: "EnvironmentRuntime", env_id: str, params: SpecParams, userns: bool | None = None) -> Environment:
    """A runc container of `params`' spec on the empty, shared `<env>/rootfs` (see the module
    doc); on failure everything made so far is destroyed before the error rises."""
    params = rt.spec_params(env_id, params)
    env = Environment(rt, env_id)
    if env.dir.exists():
        raise InvalidRequest(f"environment {env_id} already exists")
    if params.volumes or params.netns_path is not None:
        raise InvalidRequest("a late-bound sandbox has no volumes and no prepared network")
    userns = uns.resolve(userns, "runc")
    if userns:
        params = replace(params, userns_map=(uns.HOST_BASE, uns.SIZE))
    spec = build_spec(str(env.rootfs), params)
    try:
        env.dir.mkdir(parents=True)
        env._write_meta({"id": env_id, "lowers": [], "fork_layers": [], "created": time.time(),
                         "cwd": params.cwd, "cgroup_parent": rt.config.cgroup_parent,
                         "runtime": "runc", "userns": userns, "late_root": UNBOUND})
        for d in (env.upper, env.work, env.rootfs, env.bundle):
            d.mkdir()
        if userns:  # runc (mapped root) makes its mount points in the empty root
            os.chown(env.rootfs, uns.HOST_BASE, uns.HOST_BASE)
        _share(env.rootfs)
        t = time.monotonic()
        if userns:
            spec["root"]["path"] = str(uns.publish_rootfs(env.dir, env.rootfs))
        rt.start_container(env, spec, "runc", keyring=not params.seccomp)
        env.timings["start"] = time.monotonic() - t
    except BaseException:
        env.destroy()
        raise
    return env


def bind(env: Environment, lowers: Sequence[Path], fork_layers: Sequence[Path] = (),
         before_start: Callable[[Path], None] | None = None) -> None:
    """Give the unbound sandbox `env` its root: the overlay of `lowers` (top first; the first
    `fork_layers` frozen uppers, never idmapped) mounted at `<env>/rootfs`, `before_start(rootfs)`,
    then the switch. `env.timings`: mount, [mutation], start (the switch). Raises
    RuntimeFailure (or EnvironmentGone when PID 1 is gone); the sandbox is then only fit to be
    destroyed."""
    meta = env.meta()
    if meta.get("late_root") != UNBOUND:
        raise InvalidRequest(f"environment {env.id} is not an unbound sandbox")
    userns = bool(meta.get("userns"))
    env._write_meta({**meta, "lowers": [str(p) for p in lowers],
                     "fork_layers": [str(p) for p in fork_layers], "late_root": "bound"})
    t0 = time.monotonic()
    stack = [Path(p) for p in lowers]
    if userns:
        stack = env.runtime.idmapped(env, stack, skip=len(fork_layers))
    overlay.mount_overlay(stack, env.upper, env.work, env.rootfs)
    t1 = time.monotonic()
    env.timings["mount"] = t1 - t0
    if before_start is not None:
        before_start(env.rootfs)
        if userns:
            uns.shift_upper(env.upper)  # what the node wrote as host root
        env.timings["mutation"] = time.monotonic() - t1
    t2 = time.monotonic()
    _switch(env, uns.HOST_BASE if userns else 0)
    env.timings["start"] = time.monotonic() - t2


def mount_entries(spec: dict) -> list[str]:
    """The spec's top-level mount destinations as rollstack-rootswitch entries: "d/proc",
    "f/.rollstack/init" (a bind of a file); submounts (/dev/pts, /sys/fs/cgroup) move with
    their parents. Pure."""
    out: list[tuple[str, str]] = []
    for m in sorted(spec.get("mounts", []), key=lambda m: m["destination"]):
        dest = os.path.normpath(m["destination"])
        if not dest.startswith("/") or dest == "/":
            raise InvalidRequest(f"mount destination {m['destination']!r}")
        if any(dest.startswith(parent.rstrip("/") + "/") for _, parent in out):
            continue
        is_file = m.get("type") == "bind" and os.path.isfile(m.get("source", ""))
        out.append(("f" if is_file else "d", dest))
    return [f"{kind}{dest}" for kind, dest in out]


def _share(rootfs: Path) -> None:
    """`rootfs` bound onto itself, a shared mount of a peer group of its own (made private
    first: a bind of a dir of a shared mount would join that mount's group)."""
    for source, flags in ((os.fsencode(rootfs), libc.MS_BIND), (None, _MS_PRIVATE), (None, _MS_SHARED)):
        e = libc.mount(source, rootfs, None, flags)
        if e:
            raise RuntimeFailure(f"late-bound root: mount flags {flags:#x} on {rootfs}: {os.strerror(e)}")


def _switch(env: Environment, owner: int) -> None:
    """Run rollstack-rootswitch against PID 1 (pinned by a pidfd, checked in the cgroup)."""
    import json

    binary = rootswitch()
    if binary is None:
        raise RuntimeFailure(f"{ROOTSWITCH_NAME} is not built (make setup)")
    spec = json.loads((env.bundle / "config.json").read_text())
    dev = os.stat(env.rootfs).st_dev  # the overlay: the top of the mounts at <env>/rootfs
    with env.pinned_init() as pinned:
        if pinned is None:
            raise EnvironmentGone(f"sandbox {env.id}: its PID 1 is gone")
        pid, fd = pinned
        try:
            proc = subprocess.run([binary, str(fd), str(pid), str(dev), str(owner), str(owner),
                                   *mount_entries(spec)],
                                  pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=SWITCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise RuntimeFailure(f"sandbox {env.id}: the root switch timed out") from e
    if proc.returncode != 0:
        raise RuntimeFailure(f"sandbox {env.id}: {proc.stderr.decode(errors='replace').strip()}",
                             returncode=proc.returncode)
