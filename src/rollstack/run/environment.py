"""One environment's OS side, end to end: state dir, overlay, runc container, cgroups.

The pieces, one concept per module (this module re-exports them):
- rollstack.run.runtime: `RuntimeConfig`, `EnvironmentRuntime` (create, open, leftovers)
- rollstack.run.handle: `Environment` (exec, files, diff, quotas, status)
- rollstack.run.teardown: destroy and the cheap kill of an asynchronous destroy

On disk, under the runtime root (`RuntimeConfig.root`):

    <root>/runc/                 runc's state (`runc --root`)
    <root>/runsc/                runsc's state (environments with `runtime: runsc`)
    <root>/envs/<id>/meta.json   written FIRST on create: the anchor crash recovery looks for
    <root>/envs/<id>/upper/      overlay upper (the environment's writes)
    <root>/envs/<id>/work/       overlay work dir
    <root>/envs/<id>/rootfs/     the merged overlay mount = the container's root
    <root>/envs/<id>/bundle/     config.json, runc.log, init.pid

Destroy undoes create in reverse and tolerates any prefix of it having happened, so it is
idempotent and is also what crash recovery runs (`cleanup_leftovers`). Only ids found under
this root are touched: other runtimes may share the host's `rollstack/` cgroup parent.
"""

from __future__ import annotations

from rollstack.run.handle import Environment
from rollstack.run.runtime import (
    EnvironmentRuntime,
    Leftovers,
    RuntimeConfig,
    cleanup_leftovers,
    find_leftovers,
)

__all__ = ["Environment", "EnvironmentRuntime", "Leftovers", "RuntimeConfig", "cleanup_leftovers",
           "find_leftovers"]
