"""One environment's OS side, end to end: state dir, overlay, runc container, cgroups.

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

import ctypes
import ctypes.util
import json
import logging
import os
import resource
import select
import shutil
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from rollstack.host.cgroups import CGROUP_PARENT
from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.run import agent, cgroupfs, overlay, procs
from rollstack.run import userns as uns
from rollstack.run.diff import DEFAULT_EXCLUDES, LowerView, upper_diff
from rollstack.run.execpump import check_request
from rollstack.run.files import SafeRoot
from rollstack.run.initbin import find_init_binaries
from rollstack.run.network import GATEWAY_REF, NetHandle, NetworkManager, NetworkSpec, add_hosts
from rollstack.run.ocispec import ENV_ID_RE, InitBinaries, SpecParams, build_spec
from rollstack.run.execpump import ExecControl
from rollstack.run.runc import DEFAULT_OUTPUT_LIMIT, ExecResult, OnOutput, Runc

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class RuntimeConfig:
    """Where a node's environments live and what they run with."""

    root: Path
    """State dir (envs/, runc/). Must be on a local fs that can hold overlay upper dirs."""
    cgroup_parent: str = CGROUP_PARENT
    """Environments' cgroups are `<parent>/<env-id>` in every hierarchy."""
    init: InitBinaries | None = None
    """Static init + exec wrapper; None: found on the host (`find_init_binaries`)."""
    runc_binary: str = "runc"
    exec_agent: bool = True
    """Serve execs through PID 1 (rollstack-execd, run/agent.py) when the init is execd; False:
    every exec is a `runc exec` (the fallback path, also taken when an agent is unreachable)."""
    runsc_binary: str = "runsc"
    runsc_platform: str = "ptrace"
    network: NetworkManager | None = None
    """Builds per-environment network namespaces (None: a default NetworkManager when needed)."""
    network_warm: int = 0
    """Network slots kept prepared ahead (`NetworkManager.start_pool`); 0: built per create."""
    network_uplinks: tuple[str, ...] = ()
    """Host interfaces egress leaves by: their forwarding is switched on (`forward_interfaces`)."""
    subreaper: bool = True
    """Make this process a child subreaper so each container's init (orphaned when `runc run -d`
    exits) becomes our child and destroy reaps it at once, instead of leaving a zombie to a host
    init that may reap lazily. Process-wide: only safe where nothing calls os.wait()/waitpid(-1)."""


@dataclass
class Leftovers:
    """What a previous run left under a runtime root."""

    envs: list[str] = field(default_factory=list)
    """Env ids with a state dir."""
    containers: list[str] = field(default_factory=list)
    """Container ids in runc's state."""
    mounts: list[str] = field(default_factory=list)
    """Mount points under <root>/envs."""
    cgroups: list[str] = field(default_factory=list)
    """Cgroup dirs of those ids."""

    def empty(self) -> bool:
        return not (self.envs or self.containers or self.mounts or self.cgroups)


class EnvironmentRuntime:
    """The node-wide handle: creates, re-opens and cleans up environments under one root."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.root = Path(config.root).resolve()
        (self.root / "envs").mkdir(parents=True, exist_ok=True)
        self.runc = Runc(self.root / "runc", config.runc_binary)
        self._runsc: Runc | None = None
        self._idmap = None
        self._init = config.init
        self._network = config.network
        if config.subreaper:
            _set_child_subreaper()

    @property
    def init(self) -> InitBinaries:
        if self._init is None:
            self._init = find_init_binaries()
        return self._init

    @property
    def uses_agent(self) -> bool:
        """New environments get rollstack-execd's exec socket."""
        return self.config.exec_agent and self.init.agent

    @property
    def runsc(self) -> Runc:
        """The gVisor engine (rollstack.run.runsc), made on first use."""
        if self._runsc is None:
            from rollstack.run.runsc import Runsc

            self._runsc = Runsc(self.root / "runsc", self.config.runsc_binary,
                                self.config.runsc_platform, self.config.cgroup_parent)
        return self._runsc

    def engine(self, name: str) -> Runc:
        return self.runsc if name == "runsc" else self.runc

    @property
    def network(self) -> NetworkManager:
        if self._network is None:
            self._network = NetworkManager(forward_interfaces=tuple(self.config.network_uplinks))
        return self._network

    def start_network_pool(self, lazy: bool = True) -> None:
        """Keep `config.network_warm` network slots prepared (call after recovery); `lazy`: from
        the first create that asks for a network on."""
        if self.config.network_warm > 0:
            self.network.reclaim(f"{self.root}:warm")
            self.network.start_pool(f"{self.root}:", self.config.network_warm, lazy=lazy)

    def close(self) -> None:
        """Stop the warm network pool and remove its unclaimed slots."""
        if self._network is not None:
            self._network.stop_pool()

    def env_dir(self, env_id: str) -> Path:
        return self.root / "envs" / env_id

    def create(self, env_id: str, lowers: Sequence[Path], params: SpecParams,
               before_start: Callable[[Path], None] | None = None,
               network: NetworkSpec | None = None, runtime: str = "runc",
               userns: bool | None = None) -> "Environment":
        """Mount, (optionally) prepare the rootfs, start. `env.timings` = {mount, [mutation],
        [network], start}.

        `network`: a spec needing a namespace (rollstack.run.network) gets one, built while the
        overlay mounts (`${ROLLSTACK_GATEWAY}` in `params.env` values becomes its gateway); `timings["network"]` is its own duration, `["network_wait"]` what it
        added to the create after the mount and mutation.

        `runtime`: "runc" or "runsc" (gVisor; RuntimeFailure naming it when not installed).
        `userns`: root inside mapped to host 100000.. (rollstack.run.userns); None: where the
        node supports it, False: never, True: or fail.
        `before_start(rootfs)` runs between mount and start (the node applies the task mutation
        there). On any failure everything created so far is destroyed before the error rises.
        """
        if params.env_id != env_id:
            params = replace(params, env_id=env_id)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY and params.nofile > hard:
            # runc cannot raise a hard limit above its own without CAP_SYS_RESOURCE.
            params = replace(params, nofile=int(hard))
        params = replace(params, init=self.init, cgroup_parent=self.config.cgroup_parent)
        env = Environment(self, env_id)
        if env.dir.exists():
            raise InvalidRequest(f"environment {env_id} already exists")
        spec = build_spec(str(env.rootfs), params)  # validates before touching the disk
        if runtime not in ("runc", "runsc"):
            raise InvalidRequest(f"runtime: {runtime!r} is not runc or runsc")
        if runtime == "runsc":
            from rollstack.run.runsc import runsc_available

            if not runsc_available(self.config.runsc_binary):
                raise RuntimeFailure(f"runtime: runsc is not installed on this node "
                                     f"({self.config.runsc_binary} not found)")
        userns = uns.resolve(userns, runtime)
        if userns:
            params = replace(params, userns_map=(uns.HOST_BASE, uns.SIZE))
            spec = build_spec(str(env.rootfs), params)
        net_job: _NetJob | None = None
        try:
            env.dir.mkdir(parents=True)
            env._write_meta({"id": env_id, "lowers": [str(p) for p in lowers],
                             "created": time.time(), "cwd": params.cwd,
                             "cgroup_parent": self.config.cgroup_parent, "runtime": runtime,
                             "userns": userns})
            for d in (env.upper, env.work, env.rootfs, env.bundle):
                d.mkdir()
            if network is not None and network.needs_netns:
                # userns: the netns must belong to the environment's user namespace (runc exec
                # joins the userns first, then could not enter a netns owned by ours), so runc
                # makes it and the veth moves in after start (no warm slot, no overlap).
                handle = self.network.claim(f"{self.root}:{env_id}") if userns \
                    else self.network.acquire(f"{self.root}:{env_id}")
                env._write_meta({**env.meta(), "net": handle.to_dict()})
                if not userns:
                    net_job = _NetJob(self.network, handle, network)
                env_vars = {k: v.replace(GATEWAY_REF, handle.gateway) for k, v in params.env.items()}
                spec = build_spec(str(env.rootfs), replace(
                    params, netns_path=None if userns else handle.netns_path, env=env_vars))
            t0 = time.monotonic()
            stack = [Path(p) for p in lowers]
            if userns:
                stack = self._idmapped(env, stack)  # counted in timings["mount"]
            overlay.mount_overlay(stack, env.upper, env.work, env.rootfs)
            t1 = time.monotonic()
            env.timings["mount"] = t1 - t0
            if network is not None and network.hosts:  # allowed names, without DNS
                add_hosts(SafeRoot(env.rootfs, uns.HOST_BASE if userns else 0), network)
            if before_start is not None:
                before_start(env.rootfs)
                if userns:
                    uns.shift_upper(env.upper)  # what the node wrote as host root
                env.timings["mutation"] = time.monotonic() - t1
            if net_job is not None:
                tw = time.monotonic()
                env.timings["network"] = net_job.wait()
                env.timings["network_wait"] = time.monotonic() - tw
            t2 = time.monotonic()
            if userns:
                spec["root"]["path"] = str(uns.publish_rootfs(env.dir, env.rootfs))
            (env.bundle / "config.json").write_text(json.dumps(spec, indent=1))
            # gVisor: execd is PID 1 without an exec socket (execs go through `runsc exec`)
            listener = agent.bind_listener(env.dir) if self.uses_agent and runtime == "runc" else None
            try:
                engine = self.engine(runtime)
                env.pid = engine.run_detached(env_id, env.bundle, listen_fd=listener.fileno()) \
                    if listener is not None else engine.run_detached(env_id, env.bundle)
            finally:
                if listener is not None:
                    listener.close()  # the init holds its own copy
            env.timings["start"] = time.monotonic() - t2
            if userns and network is not None and network.needs_netns:
                t3 = time.monotonic()
                self.network.setup(handle, network, attach_pid=env.pid)
                env.timings["network"] = env.timings["network_wait"] = time.monotonic() - t3
        except BaseException:
            if net_job is not None:
                net_job.join()  # never tear down under a setup still running
            try:
                env.destroy()
            except Exception:  # noqa: BLE001 - the create's own error is the one to report
                logging.getLogger(__name__).exception("cleaning up the failed create of %s failed", env_id)
            raise
        return env

    def _idmapped(self, env: "Environment", lowers: list[Path]) -> list[Path]:
        """Idmapped clones of the lowers under <env>/idmap/<i>; the upper owned by mapped root."""
        if self._idmap is None:
            self._idmap = uns.IdMap()
        out = []
        for i, lower in enumerate(lowers):
            twin = uns.layer_view(lower)
            if twin is not None:  # a lazy-store layer: its shifted view (rollstack.mount.shift)
                out.append(twin)
                continue
            d = env.dir / "idmap" / str(i)
            d.mkdir(parents=True)
            self._idmap.mount(lower, d)
            out.append(d)
        os.chown(env.upper, uns.HOST_BASE, uns.HOST_BASE)
        return out

    def open(self, env_id: str) -> "Environment":
        """Re-open an existing environment (e.g. adopted after an agent restart)."""
        env = Environment(self, env_id)
        if not env.meta_path.exists():
            raise EnvironmentGone(f"environment {env_id} has no state under {self.root}")
        return env

    def find_leftovers(self) -> Leftovers:
        """Everything under this root a previous run left: env dirs, containers, mounts, cgroups."""
        left = Leftovers()
        envs_dir = self.root / "envs"
        left.envs = sorted(p.name for p in envs_dir.iterdir()
                           if p.is_dir() and ENV_ID_RE.fullmatch(p.name)) \
            if envs_dir.is_dir() else []
        try:
            left.containers = sorted(c.id for c in self.runc.list() if ENV_ID_RE.fullmatch(c.id))
        except RuntimeFailure:
            left.containers = []
        if (self.root / "runsc").is_dir():
            try:
                left.containers = sorted(set(left.containers) | {
                    c.id for c in self.runsc.list() if ENV_ID_RE.fullmatch(c.id)})
            except RuntimeFailure:
                pass
        prefix = str(envs_dir) + "/"
        left.mounts = sorted({mp for mp, _ in overlay.mount_points() if mp.startswith(prefix)})
        mounts = cgroupfs.cgroup_mounts()
        for env_id in sorted(set(left.envs) | set(left.containers)):
            left.cgroups += [str(p) for p in
                             cgroupfs.env_cgroup_dirs(env_id, self.config.cgroup_parent, mounts)]
        return left

    def cleanup_leftovers(self) -> Leftovers:
        """Destroy everything `find_leftovers` reports; returns what was found.

        Call it when no exec is in flight (agent start/stop): it also clears exec scratch files.
        """
        left = self.find_leftovers()
        for stale in self.runc.scratch.iterdir():
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
        for env_id in sorted(set(left.envs) | set(left.containers)):
            Environment(self, env_id).destroy()
        for mp in reversed(left.mounts):  # mounts whose env dir is already gone
            overlay.unmount(Path(mp))
        if self._network is not None or (self.network.state_dir / "slots").is_dir():
            self.network.reclaim(f"{self.root}:warm")  # a crashed run's prepared, unclaimed slots
        return left


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

    def _write_meta(self, meta: dict) -> None:
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.meta_path)

    def _members(self) -> list[procs.ProcRef]:
        """The environment's processes (from its cgroups), for reaping during teardown."""
        refs: dict[int, procs.ProcRef] = {}
        for cg in cgroupfs.env_cgroup_dirs(self.id, self.runtime.config.cgroup_parent):
            for pid in cgroupfs.cgroup_procs(cg):
                if pid not in refs and (r := procs.ref(pid)) is not None:
                    refs[pid] = r
        return list(refs.values())

    def _init_pid(self) -> int | None:
        try:
            return int((self.bundle / "init.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def meta(self) -> dict:
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
            doc = json.loads(self.meta_path.read_text()).get("net")
        except (OSError, ValueError):
            return None
        return NetHandle.from_dict(doc) if doc else None

    @property
    def lowers(self) -> list[Path]:
        return [Path(p) for p in self.meta()["lowers"]]

    # -- use ---------------------------------------------------------------------------------

    def exec(self, cmd: Sequence[str] | str, *, cwd: str | None = None,
             env: Mapping[str, str] | None = None, stdin: bytes | None = None,
             timeout: float | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
             on_output: OnOutput | None = None, control: ExecControl | None = None) -> ExecResult:
        """Run argv (or a shell string through `/bin/sh -c`) in the environment: through its
        exec agent (PID 1) when it has one, else (or when the agent is unreachable) `runc exec`.

        `control`: a handle the caller keeps while it runs (open stdin, signals, pid); such an
        exec always goes through `runc exec` (the agent protocol has no open stdin or signals)."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if self.runtime.config.exec_agent and control is None and self.runtime_name == "runc":
            check_request(argv, cwd, env, timeout, output_limit)
            pump = agent.AgentPump(agent.socket_path(self.dir), argv, cwd, env, stdin, timeout,
                                   output_limit, on_output, 0.2, self.id)
            try:
                return pump.run()
            except agent.AgentUnavailable as e:
                if not self.meta_path.exists():
                    raise EnvironmentGone(f"environment {self.id} has no state") from e
                # no agent (catatonit init, made before the agent) or it is not listening
                # (the container is gone: runc exec says so precisely)
            except RuntimeFailure as e:
                # the shim dies with everything else when PID 1 is killed (destroy, OOM end)
                init = self._init_pid()
                if init is None or _wait_exit(init, [], timeout=0.5) or self.status() != "running":
                    raise EnvironmentGone(f"environment {self.id} is not running: {e}") from e
                raise
        return self.engine.exec(self.id, argv, cwd=cwd, env=env, stdin=stdin,
                                      timeout=timeout, output_limit=output_limit,
                                      on_output=on_output, control=control)

    @property
    def files(self) -> SafeRoot:
        """Read/write access to the merged root that never escapes it."""
        if not overlay.is_mounted(self.rootfs):
            raise EnvironmentGone(f"environment {self.id} has no mounted root")
        return SafeRoot(self.rootfs, uns.HOST_BASE if self.meta().get("userns") else 0)

    def diff(self, base: str = "/", excludes: Sequence[str] = DEFAULT_EXCLUDES,
             binary: str = "name") -> str:
        """The environment's changes as a git-style unified diff, paths relative to `base`.

        `binary`: "name" (binary files only named) or "patch" (git binary patches)."""
        if not self.upper.is_dir():
            raise EnvironmentGone(f"environment {self.id} has no upper dir")
        return upper_diff(self.upper, LowerView(self.lowers), base=base, excludes=excludes,
                          binary=binary)

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

    # -- teardown ----------------------------------------------------------------------------

    def kill_init(self) -> bool:
        """SIGKILL the environment's PID 1 without runc (the kernel then ends its whole pid
        namespace); cheap, for asynchronous destroys. Only a process that is still in this
        environment's cgroup is signalled (through a pidfd: no pid-reuse race). True if sent."""
        pid = self._init_pid()
        if pid is None:
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            if f"/{self.runtime.config.cgroup_parent.strip('/')}/{self.id}" not in \
                    Path(f"/proc/{pid}/cgroup").read_text():
                return False
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def destroy(self) -> None:
        """Kill, runc delete, remove cgroups, unmount, remove the state dir. Idempotent."""
        runc, errors = self.engine, []
        init_pid = self._init_pid()
        if runc.has_state(self.id):
            # kill + wait + plain delete: `runc delete --force` sleeps >= 100 ms polling.
            members = self._members()
            if not self.kill_init():  # PID 1 through a pidfd: no runc process needed
                try:
                    runc.kill(self.id, "KILL")
                except RuntimeFailure:
                    pass  # not running any more: delete below handles it
            exited = init_pid is not None and _wait_exit(init_pid, members)
            if exited and self.runtime_name == "runc":
                # init (and so its whole pid namespace) is dead: what `runc delete` would still
                # do is remove its state dir (cgroups are removed below); skip that Go process
                shutil.rmtree(runc.root / self.id, ignore_errors=True)
        if runc.has_state(self.id):  # runsc keeps `<id>_sandbox:*` files, not a dir
            try:
                runc.delete(self.id)
            except RuntimeFailure:
                try:
                    runc.delete(self.id, force=True)
                except RuntimeFailure as e:
                    errors.append(str(e))
                    runc.drop_state(self.id)
        if init_pid is not None:
            _reap(init_pid, wait=0)
        for cg in cgroupfs.env_cgroup_dirs(self.id, self.runtime.config.cgroup_parent):
            try:
                cgroupfs.remove_cgroup(cg)
            except OSError as e:
                errors.append(f"cgroup {cg}: {e}")
        net, net_left = self.net, False
        if net is not None:
            try:
                self.runtime.network.teardown(net)
            except RuntimeFailure as e:
                errors.append(str(e))
                net_left = True  # keep meta.json: it is how a retry finds the slot
        try:
            uns.unpublish_rootfs(self.dir)
            overlay.unmount(self.rootfs)
        except RuntimeFailure as e:
            errors.append(str(e))
        idmaps = sorted((self.dir / "idmap").glob("*")) if (self.dir / "idmap").is_dir() else []
        for d in idmaps:  # userns: the idmapped lower clones, after the overlay over them
            try:
                overlay.unmount(d)
            except RuntimeFailure as e:
                errors.append(str(e))
        if any(overlay.is_mounted(d) for d in idmaps):
            net_left = True  # never rmtree through a mount
        if self.dir.exists() and not overlay.is_mounted(self.rootfs) and not net_left:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.dir.exists() or errors:
            raise RuntimeFailure(f"destroy of {self.id} incomplete: {'; '.join(errors)}",
                                 errors=errors)


class _NetJob:
    """`NetworkManager.setup` on a thread of its own, overlapping the overlay mount."""

    def __init__(self, manager: NetworkManager, handle: NetHandle, spec: NetworkSpec) -> None:
        import threading

        self.error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(manager, handle, spec),
                                        name=f"netns-{handle.slot}", daemon=True)
        self._thread.start()

    def _run(self, manager: NetworkManager, handle: NetHandle, spec: NetworkSpec) -> None:
        t = time.monotonic()
        try:
            manager.setup(handle, spec)
        except BaseException as e:  # noqa: BLE001 - re-raised by wait() on the create's thread
            self.error = e
        self.seconds = time.monotonic() - t

    def join(self) -> None:
        self._thread.join()

    def wait(self) -> float:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.seconds


def _set_child_subreaper() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise RuntimeFailure(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


def _wait_exit(pid: int, members: list[procs.ProcRef], timeout: float = 2.0) -> bool:
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
            if select.select([fd], [], [], 0.01)[0]:
                return True
        return False
    finally:
        os.close(fd)


def _reap(pid: int, wait: float = 2.0) -> None:
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


def find_leftovers(root: Path) -> Leftovers:
    """What a previous runtime under `root` left behind (see EnvironmentRuntime.find_leftovers)."""
    return EnvironmentRuntime(RuntimeConfig(root=root, subreaper=False)).find_leftovers()


def cleanup_leftovers(root: Path) -> Leftovers:
    """Destroy what a previous runtime under `root` left behind; returns what was found."""
    return EnvironmentRuntime(RuntimeConfig(root=root, subreaper=False)).cleanup_leftovers()
