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
   `bind_many` does a fork's children together: under a user namespace the first one makes
   idmapped views of the lowers in its dir, then every overlay is mounted at once (up to
   MOUNT_THREADS) over them (overlayfs keeps private clones of its lowers' mounts: the views may
   go with their owner), then one switch process switches them all.

Afterwards the container is what a cold create makes: the same config.json and runc state (the
root path is `<env>/rootfs` for both), namespaces, cgroup and PID 1; its mount tree differs in
propagation only (private throughout, where a cold one's root is a slave of the host's overlay
mount). The host side is a create's too, with the self-bind under the overlay (teardown unmounts
every mount stacked at `<env>/rootfs`). Which plans: what the warm pool serves (runc, the node's
default user namespace choice, no network namespace, no volumes: `rollstack.node.warm.eligible`).
A failed switch leaves a sandbox that is only destroyed; the caller creates cold.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

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
MOUNT_THREADS = 4
"""A group's overlay mounts at once: most of a mount is waiting (on the disk of the uppers and
work dirs, or on the lazy store's daemon for the xattr probes over FUSE lowers), which the others
overlap. In one process on the busybox corpus (EROFS lowers, 14 forks of 8 each way): 1 thread
91.8 ms per fork of 8, 4 threads 73.9 ms, 8 threads no better than 4."""


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
        _premake(env.upper, spec, uns.HOST_BASE if userns else 0)
        _share(env.rootfs)
        t = time.monotonic()
        if userns:
            spec["root"]["path"] = str(uns.publish_rootfs(env.dir, env.rootfs))
        rt.start_container(env, spec, "runc", keyring=not params.seccomp)
        env.timings["start"] = time.monotonic() - t
    except BaseException:
        env.destroy_after_failure("start")
        raise
    return env


def bind(env: Environment, lowers: Sequence[Path], fork_layers: Sequence[Path] = (),
         before_start: Callable[[Path], None] | None = None,
         exec_defaults: tuple[str, Mapping[str, str]] | None = None) -> None:
    """Give the unbound sandbox `env` its root: the overlay of `lowers` (top first; the first
    `fork_layers` frozen uppers, never idmapped) mounted at `<env>/rootfs`, `before_start(rootfs)`,
    then the switch. `env.timings`: mount, [mutation], start (the switch). Raises
    RuntimeFailure (or EnvironmentGone when PID 1 is gone); the sandbox is then only fit to be
    destroyed. `exec_defaults`: (cwd, env) every exec gets (`Environment.set_exec_defaults`),
    written with the rest of meta.json."""
    failed = bind_many([env], lowers, fork_layers, before_start, exec_defaults)
    if failed:
        raise failed[env.id]


def bind_many(envs: Sequence[Environment], lowers: Sequence[Path], fork_layers: Sequence[Path] = (),
              before_start: Callable[[Path], None] | None = None,
              exec_defaults: tuple[str, Mapping[str, str]] | None = None) -> dict[str, Exception]:
    """`bind` for several sandboxes on the same lowers (a fork's children): each root mounted,
    then one rollstack-rootswitch process switches them all. Returns the failures by sandbox
    id (those sandboxes are only fit to be destroyed); the others are bound."""
    failed: dict[str, Exception] = {}
    mounted: list[Environment] = []
    claimed: dict[str, bool] = {}  # id -> its user-namespace flag, once meta.json says bound
    views: list[Path] | None = None  # idmapped lowers, made in the first one's dir, for all

    def claim(env: Environment) -> bool:
        if env.id not in claimed:
            claimed[env.id] = _claim(env, lowers, fork_layers, exec_defaults)
        return claimed[env.id]

    for env in envs:  # the first one makes the views (the others wait for them)
        try:
            if not claim(env):
                break  # a pool's sandboxes are alike: no user namespace, no views
            views = env.runtime.idmapped(env, [Path(p) for p in lowers], skip=len(fork_layers))
            break
        except Exception as e:  # noqa: BLE001 - reported per sandbox; the next one tries
            failed[env.id] = e

    def mount(env: Environment) -> None:
        try:
            userns = claim(env)
            stack = [Path(p) for p in lowers]
            if userns:
                stack = views if views is not None else env.runtime.idmapped(env, stack, skip=len(fork_layers))
            _mount(env, stack, userns, before_start)
            mounted.append(env)
        except Exception as e:  # noqa: BLE001 - reported per sandbox
            failed[env.id] = e

    todo = [env for env in envs if env.id not in failed]
    if len(todo) > 1:  # every mount at once: much of one is waiting (on the disk the uppers are on)
        list(workers().map(mount, todo))
    elif todo:
        mount(todo[0])
    if mounted:
        failed.update(_switch(mounted))
    return failed


_MOUNTERS: ThreadPoolExecutor | None = None
_MOUNTERS_LOCK = threading.Lock()


def workers() -> ThreadPoolExecutor:
    """The node's bind threads (also for the node's other per-child steps of a bind: a child's
    network), kept between forks: starting them per fork cost more than the mounts they overlap
    (each `Thread.start` waits for the new thread to take the GIL)."""
    global _MOUNTERS
    with _MOUNTERS_LOCK:
        if _MOUNTERS is None:
            _MOUNTERS = ThreadPoolExecutor(MOUNT_THREADS, thread_name_prefix="rollstack-bind")
        return _MOUNTERS


def _claim(env: Environment, lowers: Sequence[Path], fork_layers: Sequence[Path],
           exec_defaults: tuple[str, Mapping[str, str]] | None) -> bool:
    """Mark the unbound sandbox `env` bound (what a create writes in meta.json before its start:
    the lowers, the fork layers, the exec defaults; never again: a sandbox is bound once, even
    when its bind fails). Returns whether it runs in a user namespace."""
    meta = env.meta()
    if meta.get("late_root") != UNBOUND:
        raise InvalidRequest(f"environment {env.id} is not an unbound sandbox")
    defaults = {} if exec_defaults is None else {"exec_cwd": exec_defaults[0], "exec_env": dict(exec_defaults[1])}
    env._write_meta({**meta, "lowers": [str(p) for p in lowers],
                     "fork_layers": [str(p) for p in fork_layers], "late_root": "bound", **defaults})
    return bool(meta.get("userns"))


def _mount(env: Environment, stack: list[Path], userns: bool,
           before_start: Callable[[Path], None] | None) -> None:
    """Mount `env`'s overlay of `stack` (under a user namespace: idmapped views of the lowers,
    made by `runtime.idmapped` in the dir of this or a sibling sandbox: overlayfs keeps private
    clones of its lowers' mounts, so the views may go with their owner), then write what a
    create writes before its start (`before_start`)."""
    t0 = time.monotonic()
    if userns:
        os.chown(env.upper, uns.HOST_BASE, uns.HOST_BASE)  # as `idmapped` does
    overlay.mount_overlay(stack, env.upper, env.work, env.rootfs)
    t1 = time.monotonic()
    env.timings["mount"] = t1 - t0
    if before_start is not None:
        before_start(env.rootfs)
        if userns:
            uns.shift_upper(env.upper)  # what the node wrote as host root
        env.timings["mutation"] = time.monotonic() - t1


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


def _premake(upper: Path, spec: dict, owner: int) -> None:
    """The nested mount points the switch would create in the upper (`/.rollstack/init`, ...;
    images have no `/.rollstack`), made now in the still unmounted upper: an inode on the node
    root's disk costs 0.25-0.65 ms here, and a fork's children need theirs at once. The
    top-level ones (/proc, /dev, /sys) are the image's own and are left to the switch."""
    for entry in mount_entries(spec):
        kind, rel = entry[0], entry[2:]
        parts = rel.split("/")
        if len(parts) < 2:
            continue
        d = upper
        for part in parts[:-1]:
            d = d / part
            if not d.exists():
                d.mkdir(mode=0o755)
                os.chown(d, owner, owner)
        leaf = d / parts[-1]
        if kind == "f":
            leaf.touch(mode=0o755)
        else:
            leaf.mkdir(mode=0o755)
        os.chown(leaf, owner, owner)


def _share(rootfs: Path) -> None:
    """`rootfs` bound onto itself, a shared mount of a peer group of its own (made private
    first: a bind of a dir of a shared mount would join that mount's group)."""
    for source, flags in ((os.fsencode(rootfs), libc.MS_BIND), (None, _MS_PRIVATE), (None, _MS_SHARED)):
        e = libc.mount(source, rootfs, None, flags)
        if e:
            raise RuntimeFailure(f"late-bound root: mount flags {flags:#x} on {rootfs}: {os.strerror(e)}")


def _switch(envs: Sequence[Environment]) -> dict[str, Exception]:
    """Run rollstack-rootswitch once against the PID 1 of each of `envs` (each pinned by a
    pidfd, checked in its cgroup); their roots are mounted. Returns the failures by id;
    `env.timings["start"]` of the others is the switch's share."""
    import json

    binary = rootswitch()
    if binary is None:
        return {e.id: RuntimeFailure(f"{ROOTSWITCH_NAME} is not built (make setup)") for e in envs}
    spec = json.loads((envs[0].bundle / "config.json").read_text())  # one shape: the pool's
    owner = uns.HOST_BASE if envs[0].meta().get("userns") else 0
    failed: dict[str, Exception] = {}
    targets: list[tuple[Environment, str, int]] = []
    t = time.monotonic()
    with contextlib.ExitStack() as pins:
        for env in envs:
            pinned = pins.enter_context(env.pinned_init())
            if pinned is None:
                failed[env.id] = EnvironmentGone(f"sandbox {env.id}: its PID 1 is gone")
                continue
            try:
                dev = os.stat(env.rootfs).st_dev  # the overlay: the top of the mounts at <env>/rootfs
            except OSError as e:
                failed[env.id] = RuntimeFailure(f"sandbox {env.id}: its root: {e}")
                continue
            targets.append((env, f"{pinned[1]}:{pinned[0]}:{dev}", pinned[1]))
        if not targets:
            return failed
        timed_out = False
        try:
            proc = subprocess.run([binary, str(owner), str(owner), *mount_entries(spec), "--",
                                   *(arg for _, arg, _ in targets)],
                                  pass_fds=tuple(fd for _, _, fd in targets), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=SWITCH_TIMEOUT_S)
            out, err = proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:  # killed (its per-target children die with it)
            timed_out, out, err = True, e.stdout or b"", e.stderr or b""
    took = (time.monotonic() - t) / len(targets)
    done = switched(out.decode(errors="replace"), len(targets))  # before a timeout too
    errors = err.decode(errors="replace").splitlines()
    for i, (env, _, _) in enumerate(targets):
        if i in done:
            env.timings["start"] = took
            continue
        why = [line for line in errors if f"[{i}]" in line] or \
            [f"the root switch timed out after {SWITCH_TIMEOUT_S:.0f} s" if timed_out else "no outcome"]
        failed[env.id] = RuntimeFailure(f"sandbox {env.id}: {'; '.join(why)}")
    return failed


def switched(stdout: str, n: int) -> set[int]:
    """The targets rollstack-rootswitch's output reports switched ("N ok" lines, printed as
    each ends: a killed switch's partial output counts its finished ones). Pure."""
    done = set()
    for line in stdout.splitlines():
        index, _, outcome = line.partition(" ")
        if index.isdigit() and int(index) < n and outcome == "ok":
            done.add(int(index))
    return done
