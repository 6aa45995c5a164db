"""`EnvironmentRuntime`: the node-wide side of environments under one root: create (state dir,
overlay, network, spec, runc), re-open, and finding/cleaning a previous run's leftovers.

The on-disk layout is described in rollstack.run.environment.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from rollstack.host.cgroups import CGROUP_PARENT
from rollstack.errors import EnvironmentGone, InvalidRequest, RuntimeFailure
from rollstack.run import agent, cgroupfs, overlay
from rollstack.run import userns as uns
from rollstack.run.handle import Environment
from rollstack.run.initbin import find_init_binaries
from rollstack.run.files import SafeRoot
from rollstack.run.network import GATEWAY_REF, NetHandle, NetworkManager, NetworkSpec, add_hosts
from rollstack.run.ocispec import ENV_ID_RE, InitBinaries, SpecParams, build_spec
from rollstack.run.runc import Runc

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
    release_page_cache_below: int = cgroupfs.RELEASE_BELOW
    """At destroy, an environment's memory cgroup charged with less page cache than this is
    reclaimed before its rmdir, so it does not live on as a dying cgroup
    (`cgroupfs.release_page_cache`); 0: never."""
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
        self._idmap = uns.IdMap()  # one for every create (its namespace is made on first use)
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
        """Stop the warm network pool and remove its unclaimed slots; close the id mapping's
        user namespace fd (a later user-namespaced create makes a new one)."""
        if self._network is not None:
            self._network.stop_pool()
        self._idmap.close()

    def env_dir(self, env_id: str) -> Path:
        return self.root / "envs" / env_id

    def create(self, env_id: str, lowers: Sequence[Path], params: SpecParams,
               before_start: Callable[[Path], None] | None = None,
               network: NetworkSpec | None = None, runtime: str = "runc",
               userns: bool | None = None, fork_layers: Sequence[Path] = ()) -> Environment:
        """Mount, (optionally) prepare the rootfs, start. `env.timings` = {mount, [mutation],
        [network], start}.

        `network`: a spec needing a namespace (rollstack.run.network) gets one, built while the
        overlay mounts (`${ROLLSTACK_GATEWAY}` in `params.env` values becomes its gateway); `timings["network"]` is its own duration, `["network_wait"]` what it
        added to the create after the mount and mutation.

        `runtime`: "runc" or "runsc" (gVisor; RuntimeFailure naming it when not installed).
        `fork_layers`: the top of `lowers` that are frozen uppers of the environment this one
        was forked from (rollstack.run.snapshot): already in the environment's id space (never
        idmapped), and part of its changes for `diff`.
        `userns`: root inside mapped to host 100000.. (rollstack.run.userns); None: where the
        node supports it, False: never, True: or fail.
        `before_start(rootfs)` runs between mount and start (the node applies the task mutation
        there). On any failure everything created so far is destroyed before the error rises.
        """
        params = self.spec_params(env_id, params)
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
                             "fork_layers": [str(p) for p in fork_layers],
                             "created": time.time(), "cwd": params.cwd,
                             "cgroup_parent": self.config.cgroup_parent, "runtime": runtime,
                             "userns": userns})
            for d in (env.upper, env.work, env.rootfs, env.bundle):
                d.mkdir()
            if userns and params.volumes:  # root inside owns what host root owns in a volume
                params = replace(params, volumes=self._idmapped_volumes(env, params.volumes))
                spec = build_spec(str(env.rootfs), params)
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
                stack = self.idmapped(env, stack, skip=len(fork_layers))  # counted in timings["mount"]
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
            self.start_container(env, spec, runtime, keyring=not params.seccomp)
            env.timings["start"] = time.monotonic() - t2
            if userns and network is not None and network.needs_netns:
                t3 = time.monotonic()
                self.network.setup(handle, network, attach_pid=env.pid)
                env.timings["network"] = env.timings["network_wait"] = time.monotonic() - t3
        except BaseException:
            if net_job is not None:
                net_job.join()  # never tear down under a setup still running
            env.destroy_after_failure("create")
            raise
        return env

    def spec_params(self, env_id: str, params: SpecParams) -> SpecParams:
        """`params` as this node starts them: the id, the init binaries, the cgroup parent, and
        RLIMIT_NOFILE at most our own hard limit (runc cannot raise it without
        CAP_SYS_RESOURCE)."""
        if params.env_id != env_id:
            params = replace(params, env_id=env_id)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY and params.nofile > hard:
            params = replace(params, nofile=int(hard))
        return replace(params, init=self.init, cgroup_parent=self.config.cgroup_parent)

    def start_container(self, env: Environment, spec: dict, runtime: str, keyring: bool) -> None:
        """Write the bundle's config.json and `run -d` the container; `env.pid` is its init.
        `keyring=False`: no session keyring of its own (runc.run_detached: the key quota; safe
        only with the seccomp profile, which denies keyctl/add_key/request_key)."""
        (env.bundle / "config.json").write_text(json.dumps(spec, indent=1))
        # gVisor: execd is PID 1 without an exec socket (execs go through `runsc exec`)
        listener = agent.bind_listener(env.dir) if self.uses_agent and runtime == "runc" else None
        try:
            engine = self.engine(runtime)
            env.pid = engine.run_detached(env.id, env.bundle, listen_fd=listener.fileno(),
                                          new_keyring=keyring) \
                if listener is not None else engine.run_detached(env.id, env.bundle, new_keyring=keyring)
        finally:
            if listener is not None:
                listener.close()  # the init holds its own copy

    def _idmapped_volumes(self, env: Environment, volumes: Sequence[tuple[str, str, bool]]
                          ) -> tuple[tuple[str, str, bool], ...]:
        """Idmapped clones of volume dirs under <env>/idmap/v<i> (teardown unmounts everything
        there before it removes the environment's directory, and never removes through a mount)."""
        out = []
        for i, (source, target, ro) in enumerate(volumes):
            d = env.dir / "idmap" / f"v{i}"
            d.mkdir(parents=True)
            self._idmap.mount(Path(source), d)
            out.append((str(d), target, ro))
        return tuple(out)

    def idmapped(self, env: Environment, lowers: list[Path], skip: int = 0) -> list[Path]:
        """Idmapped clones of the lowers under <env>/idmap/<i>; the upper owned by mapped root.
        The first `skip` (a fork's frozen uppers) are in the environment's id space already."""
        out = list(lowers[:skip])
        for i, lower in enumerate(lowers[skip:], start=skip):
            twin = uns.layer_view(lower)
            if twin is not None:  # a lazy-store layer: its shifted view (rollstack.lazystore.shift)
                out.append(twin)
                continue
            d = env.dir / "idmap" / str(i)
            d.mkdir(parents=True)
            self._idmap.mount(lower, d)
            out.append(d)
        os.chown(env.upper, uns.HOST_BASE, uns.HOST_BASE)
        return out

    def open(self, env_id: str) -> Environment:
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
    from rollstack.host.libc import libc

    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise RuntimeFailure(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")




def find_leftovers(root: Path) -> Leftovers:
    """What a previous runtime under `root` left behind (see EnvironmentRuntime.find_leftovers)."""
    return EnvironmentRuntime(RuntimeConfig(root=root, subreaper=False)).find_leftovers()


def cleanup_leftovers(root: Path) -> Leftovers:
    """Destroy what a previous runtime under `root` left behind; returns what was found."""
    return EnvironmentRuntime(RuntimeConfig(root=root, subreaper=False)).cleanup_leftovers()
