"""`Environment`: one environment's handle (exec, files, diff, quotas, status, teardown).

Cheap to construct: all state is on disk (`<root>/envs/<id>/`, see rollstack.run.environment)
and in runc. Teardown is rollstack.run.teardown.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import tempfile
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, Mapping, Sequence

from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.host import atomic, cgroups
from rollstack.host.tree import remove_tree
from rollstack.run import agent, cgroupfs, overlay, teardown
from rollstack.run import userns as uns
from rollstack.run.diff import DEFAULT_EXCLUDES, LowerView, upper_diff
from rollstack.run.execpump import ExecControl, check_request
from rollstack.run.files import SafeRoot
from rollstack.run.network import NetHandle, NetworkSpec
from rollstack.run.ocispec import ENV_ID_RE, SHELL_PATH
from rollstack.run.runc import DEFAULT_OUTPUT_LIMIT, ExecResult, OnOutput, Runc
from rollstack.run.snapshot import merge_uppers, unshift_tree

if TYPE_CHECKING:
    from rollstack.run.runtime import EnvironmentRuntime


AGENT_IN_NETNS = "netns"
"""meta.json "agent": the exec agent listens inside the environment (after a checkpoint)."""

Offload = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a blocking call off the event loop: `await offload(fn)` -> fn()'s result."""


async def _to_thread(fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn)


class Environment:
    """One environment's handle; cheap to construct, all state is on disk and in runc."""

    def __init__(self, runtime: EnvironmentRuntime, env_id: str) -> None:
        if not isinstance(env_id, str) or not ENV_ID_RE.fullmatch(env_id):
            # ids become paths (state dir, cgroups): never let one climb out of the root
            raise InvalidRequest(f"invalid environment id {env_id!r}")
        self.runtime, self.id = runtime, env_id
        self.dir = runtime.env_dir(env_id)
        self.upper, self.work = self.dir / "upper", self.dir / "work"
        self.rootfs, self.bundle = self.dir / "rootfs", self.dir / "bundle"
        self.meta_path = self.dir / "meta.json"
        self.timings: dict[str, float] = {}
        self.pid: int | None = None
        self._exec_meta: tuple[str, str | None, dict[str, str], bool] | None = None
        self._written: dict | None = None  # meta.json as this handle last wrote it
        self.warm_lowers: tuple[str, ...] = ()  # a warm pool's sandbox: the lowers it was started on

    def _write_meta(self, meta: dict) -> None:
        atomic.replace(self.meta_path, json.dumps(meta).encode())  # a reserved tmp if any
        self._written = meta
        self._exec_meta = _exec_defaults(meta)  # what this handle's next exec would read back

    def reserve_meta(self) -> None:
        """Make the tmp inode of meta.json's next rewrite now (host.atomic): a warm sandbox's
        handout (`set_exec_defaults`) then allocates no inode."""
        atomic.reserve(self.meta_path)

    def destroy_after_failure(self, what: str) -> None:
        """Destroy what a failed create or start made; a failure of that is logged, never
        raised (the create's own error is the one to report)."""
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 - see above
            logging.getLogger(__name__).exception("cleaning up the failed %s of %s failed", what, self.id)

    def set_spec_quotas(self, cpu: float | None, memory: int | None) -> None:
        """Make config.json's CPU and memory limits these (what `runc restore` applies to the
        cgroup again): a sandbox started before its plan was known (warm, late-bound) has the
        pool's there, which a restored checkpoint would otherwise get back."""
        from rollstack.run.ocispec import CPU_PERIOD_US, quota_resources

        path = self.bundle / "config.json"
        spec = json.loads(path.read_text())
        res = spec.setdefault("linux", {}).setdefault("resources", {})
        period = int((res.get("cpu") or {}).get("period") or CPU_PERIOD_US)
        for key in ("cpu", "memory"):
            res.pop(key, None)
        res.update(quota_resources(cpu, memory, period))
        atomic.replace(path, json.dumps(spec, indent=1).encode())

    def set_exec_defaults(self, cwd: str, env: Mapping[str, str]) -> None:
        """The working directory and variables every exec gets unless it sets its own (kept in
        meta.json). For environments whose PID 1 was started before their plan was known (a
        warm sandbox, rollstack.node.warm): the spec's cwd and env are then generic, and these
        make each command see what a spec built from the plan would have given it."""
        self._write_meta({**self.meta(), "exec_cwd": cwd, "exec_env": dict(env)})

    def _exec_info(self) -> tuple[str, str | None, dict[str, str], bool]:
        """(runtime name, default cwd, default env, the agent listens inside the environment)
        from meta.json, read once per handle."""
        if self._exec_meta is None:
            try:
                doc = json.loads(self.meta_path.read_text())
            except (OSError, ValueError):
                return self.runtime_name, None, {}, False
            self._exec_meta = _exec_defaults(doc)
        return self._exec_meta

    def init_alive(self) -> bool:
        """PID 1 is running (not a zombie) and still in this environment's cgroup; no runc."""
        pid = self._init_pid()
        if pid is None:
            return False
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X") and self._cgroup_suffix() in cgroup

    @contextmanager
    def pinned_init(self) -> Iterator[tuple[int, int] | None]:
        """PID 1 pinned by a pidfd: `(pid, pidfd)` while the block runs, if that process is still
        in this environment's cgroup (no reused pid is ever taken for it), else None."""
        pid = self._init_pid()
        try:
            fd = os.pidfd_open(pid) if pid is not None else None
        except OSError:
            fd = None
        if pid is None or fd is None:
            yield None
            return
        try:
            try:
                ours = self._cgroup_suffix() in Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                ours = False
            yield (pid, fd) if ours else None
        finally:
            os.close(fd)

    def _cgroup_suffix(self) -> str:
        """What a line of /proc/PID/cgroup of the environment's processes contains."""
        return f"/{self.runtime.config.cgroup_parent.strip('/')}/{self.id}"

    def _init_pid(self) -> int | None:
        try:
            return int((self.bundle / "init.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def meta(self) -> dict:
        """meta.json's document (as this handle wrote it, if it did: only the handle that
        creates an environment, or hands a warm sandbox out, ever writes it)."""
        if self._written is not None:
            return dict(self._written)
        try:
            return json.loads(self.meta_path.read_text())
        except (OSError, ValueError) as e:
            raise EnvironmentGone(f"environment {self.id} has no readable state") from e

    @property
    def runtime_name(self) -> str:
        """"runc" or "runsc" (what created it; read from meta.json)."""
        try:
            return str(json.loads(self.meta_path.read_text()).get("runtime") or "runc")
        except (OSError, ValueError):
            has_runsc = (self.runtime.root / "runsc").is_dir() and self.runtime.runsc.has_state(self.id)
            return "runsc" if has_runsc else "runc"

    @property
    def engine(self) -> Runc:
        return self.runtime.engine(self.runtime_name)

    @property
    def net(self) -> NetHandle | None:
        """The environment's network namespace, veth and table (None: loopback only)."""
        try:
            doc = self.meta().get("net")
        except EnvironmentGone:
            return None
        return NetHandle.from_dict(doc) if doc else None

    def set_network(self, spec: NetworkSpec, before: NetworkSpec) -> None:
        """Replace the egress policy of its network namespace now, `before` being the current
        one; the names resolved in `spec` replace the old ones in /etc/hosts. All or nothing:
        a hosts file that cannot be written puts `before` back. InvalidRequest when it has no
        namespace (created with `network: none` and no `expose`: only loopback)."""
        from rollstack.run.network import add_hosts

        h = self.net
        if h is None:
            raise InvalidRequest(f"environment {self.id} was created without a network (network: none, no "
                                 "expose): its policy cannot change; create it with one (even `{allow: [...]}`)")
        self.runtime.network.apply(h, spec)
        try:
            add_hosts(self.files, spec, replace=True)
        except BaseException:
            self.runtime.network.apply(h, before)
            raise

    @property
    def lowers(self) -> list[Path]:
        return [Path(p) for p in self.meta()["lowers"]]

    @property
    def fork_layers(self) -> list[Path]:
        """The frozen uppers this environment was forked from (top first), the top of `lowers`."""
        return [Path(p) for p in self.meta().get("fork_layers", [])]

    # -- freezing ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Freeze every process: runc's environments through their cgroup's freezer directly
        (one write and a wait for the kernel: ~1 ms, against ~25 ms for each `runc pause` /
        `resume` process), gVisor's through its engine (`runsc pause`)."""
        control = self._freezer()
        if control is None:
            self.engine.pause(self.id)
        else:
            cgroups.set_frozen(control, True)

    def resume(self) -> None:
        control = self._freezer()
        if control is None:
            self.engine.resume(self.id)
        else:
            cgroups.set_frozen(control, False)

    def _freezer(self) -> Path | None:
        if self.runtime_name != "runc":
            return None
        return cgroups.freezer_file(self.id, self.meta().get("cgroup_parent") or cgroups.CGROUP_PARENT)

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Its processes frozen for the block (thawed after, whatever happens)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    @contextmanager
    def cut(self) -> Iterator[None]:
        """Frozen for a copy of its files (fork, snapshot). A gVisor sandbox first writes back
        what its own kernel caches (`sync` inside), so the host's upper holds every write made
        before the cut; runc's processes write through the host's page cache already."""
        if self.runtime_name == "runsc":
            r = self.exec([SHELL_PATH, "sync"], timeout=60)
            if r.exit_code != 0:
                raise RuntimeFailure(f"sync in {self.id} before the cut exited {r.exit_code}: {r.stderr[-300:]}")
        with self.frozen():
            yield

    # -- use ---------------------------------------------------------------------------------

    def exec(self, cmd: Sequence[str] | str, *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None,
             timeout: float | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
             on_output: OnOutput | None = None, control: ExecControl | None = None) -> ExecResult:
        """Run argv (or a shell string through `/bin/sh -c`) in the environment: through its
        exec agent (PID 1) when it has one, else (or when the agent is unreachable) `runc exec`.

        `control`: a handle the caller keeps while it runs (open stdin, signals; the host pid on
        the runc path only), on either path."""
        argv, cwd, env, pump = self._exec_plan(cmd, cwd, env, stdin, timeout, output_limit,
                                               on_output, control)
        if pump is not None:
            try:
                return pump.run()
            except agent.AgentUnavailable as e:
                self._agent_unavailable(e)
            except RuntimeFailure as e:
                self._agent_failed(e)
        return self._runc_exec(argv, cwd, env, stdin, timeout, output_limit, on_output, control)

    def _runc_exec(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None,
                   stdin: bytes | None, timeout: float | None, output_limit: int,
                   on_output: OnOutput | None = None, control: ExecControl | None = None) -> ExecResult:
        """The fallback path: `runc exec` (or runsc's) with the exec defaults already applied."""
        return self.engine.exec(self.id, argv, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                                output_limit=output_limit, on_output=on_output, control=control)

    async def exec_async(self, cmd: Sequence[str] | str, *, cwd: str | None = None,
                         env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                         timeout: float | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                         offload: Offload | None = None) -> ExecResult:
        """`exec` for a caller on an event loop (the node's API): through the agent, the exec runs
        on the loop itself (`AgentPump.run_async`: no worker thread, no hand-off between threads
        per command); every other path (`runc exec`, a full agent backlog, a large request, the
        checks after a failure) runs `exec` in a thread through `offload(fn)` (default:
        `asyncio.to_thread`). Same results and errors as `exec`."""
        offload = offload or _to_thread
        argv, cwd_, env_, pump = self._exec_plan(cmd, cwd, env, stdin, timeout, output_limit, None, None)
        if pump is not None:
            try:
                return await pump.run_async()
            except agent.AgentBusy:
                pass  # nothing was run: the blocking path below waits for the agent in a thread
            except agent.AgentUnavailable as e:
                await offload(partial(self._agent_unavailable, e))
                return await offload(partial(self._runc_exec, argv, cwd_, env_, stdin, timeout, output_limit))
            except RuntimeFailure as e:
                await offload(partial(self._agent_failed, e))
        return await offload(partial(self.exec, cmd, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                                     output_limit=output_limit))

    def _exec_plan(self, cmd: Sequence[str] | str, cwd: str | None, env: Mapping[str, str] | None,
                   stdin: bytes | None, timeout: float | None, output_limit: int,
                   on_output: OnOutput | None, control: ExecControl | None,
                   ) -> tuple[list[str], str | None, Mapping[str, str] | None, agent.AgentPump | None]:
        """(argv, cwd, env with the exec defaults, the agent exec or None for `runc exec`)."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        engine, default_cwd, default_env, in_netns = self._exec_info()
        cwd = cwd or default_cwd
        if default_env:
            env = {**default_env, **(env or {})}
        if not (self.runtime.config.exec_agent and engine == "runc"):
            return argv, cwd, env, None
        check_request(argv, cwd, env, timeout, output_limit)
        address: agent.AgentAddress = agent.socket_path(self.dir)
        if in_netns:  # moved there for a checkpoint (rollstack.run.checkpoint)
            pid = self._init_pid()
            if pid is None:
                return argv, cwd, env, None
            address = agent.NetnsAgent(pid, self._cgroup_suffix())
        return argv, cwd, env, agent.AgentPump(address, argv, cwd, env, stdin, timeout,
                                               output_limit, on_output, 0.2, self.id, control)

    def _agent_unavailable(self, e: agent.AgentUnavailable) -> None:
        """Nobody serves the agent socket: EnvironmentGone without state, else (no agent, catatonit
        init, or the container is gone: runc exec says so precisely) the caller uses runc exec."""
        if not self.meta_path.exists():
            raise EnvironmentGone(f"environment {self.id} has no state") from e

    def _agent_failed(self, e: RuntimeFailure) -> None:
        """Always raises: EnvironmentGone when PID 1 is gone (the shim dies with everything else
        when PID 1 is killed: destroy, OOM end), else `e` (also when it is frozen: a paused
        environment is not gone; the node says `environment_paused`)."""
        init = self._init_pid()
        if init is None or teardown.wait_exit(init, [], timeout=0.5) or \
                self.status() not in ("running", "paused"):
            raise EnvironmentGone(f"environment {self.id} is not running: {e}") from e
        raise e

    @property
    def files(self) -> SafeRoot:
        """Read/write access to the merged root that never escapes it."""
        if not overlay.is_mounted(self.rootfs):
            raise EnvironmentGone(f"environment {self.id} has no mounted root")
        return SafeRoot(self.rootfs, uns.HOST_BASE if self.meta().get("userns") else 0)

    def changes_copy(self, dst: Path) -> None:
        """Its changes since the stack (its upper over the layers it was forked from) copied to
        `dst` as one upper dir, owners as the environment sees them. Freeze it first."""
        merge_uppers([self.upper, *self.fork_layers], dst)
        if self.meta().get("userns"):
            unshift_tree(dst, uns.HOST_BASE)

    def diff(self, base: str = "/", excludes: Sequence[str] = DEFAULT_EXCLUDES,
             binary: str = "name") -> str:
        """The environment's changes as a git-style unified diff, paths relative to `base`.

        `binary`: "name" (binary files only named) or "patch" (git binary patches)."""
        if not self.upper.is_dir():
            raise EnvironmentGone(f"environment {self.id} has no upper dir")
        forks = self.fork_layers
        try:
            if not forks:
                return upper_diff(self.upper, LowerView(self.lowers), base=base, excludes=excludes,
                                  binary=binary)
            # forked: its changes are its upper over the uppers it was forked from, against the base
            tmp = Path(tempfile.mkdtemp(dir=self.dir, prefix="diff-"))
            try:
                merged = tmp / "upper"
                merge_uppers([self.upper, *forks], merged)
                base_lowers = self.lowers[len(forks):]
                return upper_diff(merged, LowerView(base_lowers), base=base, excludes=excludes, binary=binary)
            finally:
                remove_tree(tmp)  # any depth (tempfile's cleanup is shutil.rmtree)
        except RecursionError:  # an environment can nest directories deeper than the walk goes
            raise RuntimeFailure(f"the changes of {self.id} are nested too deep to diff") from None
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                raise
            raise RuntimeFailure(f"the changes of {self.id} are nested too deep to diff: {e}") from None

    def update(self, cpu: float | None = None, memory: int | None = None) -> None:
        self.engine.update(self.id, cpu=cpu, memory=memory)

    def status(self) -> str:
        """runc's status (running, stopped, ...) or "missing"."""
        try:
            return self.engine.state(self.id).status
        except RuntimeFailure:
            return "missing"

    def oom_kills(self) -> int:
        return cgroupfs.oom_kills(self.id, self.runtime.config.cgroup_parent)

    # -- teardown (rollstack.run.teardown) -----------------------------------------------------

    def kill_init(self) -> bool:
        """SIGKILL PID 1 through a pidfd if it is still in this environment's cgroup (the kernel
        then ends its whole pid namespace); cheap, for asynchronous destroys. True if sent."""
        return teardown.kill_init(self)

    def destroy(self) -> None:
        """Kill, runc delete, remove cgroups, unmount, remove the state dir. Idempotent."""
        teardown.destroy(self)


def _exec_defaults(meta: dict) -> tuple[str, str | None, dict[str, str], bool]:
    """(runtime name, default cwd, default env, agent in the environment) of a meta.json."""
    return (str(meta.get("runtime") or "runc"), meta.get("exec_cwd"), dict(meta.get("exec_env") or {}),
            meta.get("agent") == AGENT_IN_NETNS)
