"""`Stages`: the node's one instance of each stage, and the calls the service makes into them.

- plan/store: `open_store`, `Resolver` (resolution cache under the node root)
- lazy store: `LazyStoreClient` (FUSE daemon in its own process; layers as directories)
- runtime: `EnvironmentRuntime` (overlay, runc, cgroups, leftovers) under the node root
- provision: `Provisioner` (200 ms quota loop, admission by capacity, OOM termination)

Start order is recovery first (a previous run's environments are destroyed before anything new
mounts over their paths), then the lazy store, then the provisioner. Stop is the reverse.
The stages' types are `node.seams` (protocols) and the stages' own classes.

Size (~520 lines): one class, one method per call the service makes into a stage; the seam is
kept in one file so every cross-stage call is visible in one place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from rollstack.errors import (EnvironmentGone, EnvironmentNotFound, EnvironmentPaused, InsufficientCapacity, InvalidRequest,
                              NodeUnavailable,
                              UnsafePath)
from rollstack.node.config import NodeConfig
from rollstack.host.cgroups import CGROUP_PARENT, oom_counter_file, oom_kill_count
from rollstack.contract.models import ExecRequest, Quotas, Sample, Timings
from rollstack.node.record import EnvRecord
from rollstack.lazystore import holder
from rollstack.lazystore.protocol import LazyStore
from rollstack.lowers.stack import Lowers, flatten
from rollstack.node import recovery
from rollstack.node.forks import ForkLayers
from rollstack.node.volumes import Volumes
from rollstack.node.recovery import end_orphan_daemon
from rollstack.run import lateroot
from rollstack.run.network import GATEWAY_REF
from rollstack.fetch.traces import trace_keys

if TYPE_CHECKING:
    from rollstack.plan.model import Plan
    from rollstack.plan.resolve import LayerRef, Resolver
    from rollstack.provision.controller import Provisioner
    from rollstack.run.execpump import ExecControl, ExecResult, OnOutput
    from rollstack.run.environment import Environment, EnvironmentRuntime, Leftovers
    from rollstack.run.network import NetworkSpec
    from rollstack.store.base import ArtifactStore
    from rollstack.node.warm import WarmPool

log = logging.getLogger(__name__)

LAZY_RESTART_WAIT = 30.0
"""Seconds a create waits for the successor of a lazy store daemon that died under it."""
_FETCH_KEYS = ("fetched_bytes", "from_cache_bytes", "from_peer_bytes")
DIFF_BASE = "/"
"""The diff names paths from the environment root (the evaluator applies it the same way)."""


@dataclass(frozen=True)
class Prepared:
    """What `Stages.prepare` computed for a plan (shared by the environments of one group)."""

    stack: Any
    refs: list[Any]
    lowers: list[Path]
    group: Any = None
    """A GRPO group's work done for all its environments at once (rollstack.node.fanout.Group)."""
    fork_layers: list[Path] = field(default_factory=list)
    """A fork's frozen uppers (top first), the top of `lowers` (rollstack.node.forks)."""
    fork: dict[str, float] = field(default_factory=dict)
    """A fork's cut: files, bytes, pause_s, copy_s."""


@dataclass(frozen=True)
class ForkedStack:
    """The stack a fork's children share: the parent's (its digest names traces)."""

    stack_digest: str | None


@dataclass
class Built:
    runtime: Environment
    refs: list[LayerRef]
    stack_digest: str | None
    fetch: dict[str, int] = field(default_factory=dict)
    network: dict[str, Any] | None = None


def _under(out: Any, mount: str) -> Any:
    """Entries of a volume (paths from its top) as the environment sees them, under `mount`."""
    from dataclasses import replace

    if isinstance(out, list):
        return [_under(e, mount) for e in out]
    if out is None:
        return None
    return replace(out, path=mount if out.path == "/" else mount + out.path)


class Stages:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.store: ArtifactStore | None = None
        self.resolver: Resolver | None = None
        self.lazy: LazyStore | None = None
        self.runtime: EnvironmentRuntime | None = None
        self.provisioner: Provisioner | None = None
        self.lowers: Lowers | None = None
        self.forks = ForkLayers(config.root / "forks", config.fork_memory)
        self.volumes = Volumes(config.root)
        self.recovered: Leftovers | None = None
        self.adopted: list[tuple[Environment, dict[str, Any]]] = []
        self.warm: WarmPool | None = None
        """Started sandboxes handed out at create (rollstack.node.warm.attach sets it)."""
        self.late: WarmPool | None = None
        """Late-bound sandboxes a fork's children take (rollstack.node.warm.attach sets it)."""
        self.rekey: Callable[[EnvRecord, str], None] | None = None
        """Renames an admitted record to a warm sandbox's id (the service's map is keyed by it)."""

    @classmethod
    def start(cls, config: NodeConfig, on_terminate: Callable[..., None]) -> "Stages":
        self = cls(config)
        try:
            self._start(on_terminate)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, on_terminate: Callable[..., None]) -> None:
        from rollstack.plan.model import load_plan
        from rollstack.plan.resolve import Resolver
        from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
        from rollstack.store import default_store_spec, open_store

        cfg = self.config
        cfg.root.mkdir(parents=True, exist_ok=True)
        self.volumes.start()
        self.runtime = EnvironmentRuntime(RuntimeConfig(root=cfg.root, exec_agent=cfg.exec_agent,
                                                        network_warm=cfg.network_warm,
                                                        network_uplinks=tuple(cfg.network_uplinks)))
        spec = self._spec = cfg.store or default_store_spec()
        self.store = open_store(spec)
        self.resolver = Resolver(self.store, cfg.resolve_cache, cfg.resolve_ttl)
        old_daemon = self._live_daemon() if cfg.adopt else None
        # the old daemon died but its fd-holder keeps the FUSE connection: a new daemon takes it
        # over, and the environments stacked on it have working lower dirs again
        held = cfg.adopt and old_daemon is None and holder.ping(cfg.lazy_dir / "state") == "orphaned"
        if held:
            self.lazy = self._start_lazy(spec)
        self.adopted, self.recovered = recovery.adopt_or_clean(
            self.runtime, recovery.load_records(cfg.root), can_adopt=old_daemon is not None or held
        )
        if not self.recovered.empty():
            log.warning("previous run left %s; re-adopted %s", self.recovered, [e.id for e, _ in self.adopted])
        self.runtime.start_network_pool()  # after recovery: a crashed run's warm slots are gone
        self.forks.start()
        self.forks.collect(p for env, _ in self.adopted for p in env.fork_layers)
        if self.lazy is None:  # the old daemon's mounts hold adopted environments' lower dirs
            self.lazy = old_daemon if self.adopted else self._start_lazy(spec)
        self.lowers = Lowers.start(cfg.lowers, self.lazy, layers_dir=cfg.materialized_dir, erofs_dir=cfg.root / "erofs",
                                   tocs_dir=cfg.lazy_dir / "state" / "tocs", chunk_cache=cfg.lazy_dir / "state" / "chunks",
                                   store=spec, cgroup_tag=_node_tag(cfg.root), fetch_image=self._published_image,
                                   on_ready=self._lowers_changed)
        if cfg.provision:
            self.provisioner = self._start_provisioner(on_terminate)
            for env, doc in self.adopted:
                if doc.get("paused"):  # its quotas were given back when it was paused
                    continue
                res = load_plan(doc["plan"]).resources
                try:
                    self.provisioner.register(env.id, f"{CGROUP_PARENT}/{env.id}", res.cpu, res.memory,
                                              res.max_cpu, res.max_memory, check_admission=False)
                except Exception:  # noqa: BLE001 - it still runs, only without elastic quotas
                    log.exception("re-registering adopted environment %s failed", env.id)

    def _published_image(self, ref: Any) -> bytes:
        """The EROFS image published beside layer `ref` (plan/lowers.py), read from the store."""
        from rollstack.plan.lowers import MAX_IMAGE_BYTES

        if not 0 < ref.erofs_size <= MAX_IMAGE_BYTES:
            raise ValueError(f"published image of {ref.erofs_size} bytes")
        assert self.store is not None
        return self.store.read_blob(ref.repo, ref.erofs, 0, ref.erofs_size)

    def _live_daemon(self) -> LazyStore | None:
        """A client of the lazy store daemon a previous agent left serving our mountpoint, if healthy."""
        from rollstack.lazystore.client import LazyStoreClient

        lazy = self.config.lazy_dir
        if not recovery.daemon_pids(lazy / "mnt"):
            return None
        client = LazyStoreClient.connect(lazy / "mnt", lazy / "state")
        return client if client.healthy() else None

    def ensure_lazy(self) -> bool:
        """Restart the lazy store daemon if it died. Its fd-holder keeps the FUSE connection, so
        the new daemon takes it over under the running environments (lazystore/holder.py). True if
        a daemon was restarted."""
        if not self._daemon_dead(self.lazy):
            return False
        proc = self.lazy.process if self.lazy is not None else None
        log.error("lazy store daemon %s; starting a successor",
                  f"exited with {proc.returncode}" if proc is not None else "adopted at start is gone")
        self.lazy = self._start_lazy(self._spec)
        if self.lowers is not None:
            self.lowers.set_lazy(self.lazy)
        return True

    def lazy_call(self, call: Callable[[LazyStore], Any]) -> Any:
        """`call(the lazy store)`; when the daemon died under it (node_unavailable from a dead
        process), wait for its successor (the service's `watch_lazy` starts one within a
        second) and call that once more, so a create that meets a daemon restart goes on
        instead of failing. A daemon that is alive but answers badly is not retried."""
        lazy = self.lazy
        try:
            return call(lazy)
        except NodeUnavailable:
            if not self._await_successor(lazy):
                raise
        return call(self.lazy)

    def _daemon_dead(self, lazy: LazyStore) -> bool:
        """Our child daemon exited, or (one adopted from a previous agent, not our child) no
        daemon process serves our mountpoint any more."""
        proc = lazy.process if lazy is not None else None
        if proc is not None:
            return proc.poll() is not None
        return not recovery.daemon_pids(self.config.lazy_dir / "mnt")

    def _await_successor(self, dead: LazyStore) -> bool:
        deadline = time.monotonic() + 0.5  # a dying daemon closes its socket a moment before it is gone
        while not self._daemon_dead(dead):
            if time.monotonic() >= deadline:
                return False  # alive: a real error, not a restart
            time.sleep(0.05)
        deadline = time.monotonic() + LAZY_RESTART_WAIT
        while time.monotonic() < deadline:
            current = self.lazy
            if current is not dead and current.healthy():
                return True
            time.sleep(0.1)
        return False

    def reattach(self, recs: list[EnvRecord]) -> int:
        """Register running environments with a restarted daemon, so their reads are attributed
        again (no trace prefetch or background fill: those ran when they were created).
        Returns how many were registered."""
        n = 0
        for rec in recs:
            if not rec.refs:
                continue
            try:
                self.lazy.begin_env(rec.id, rec.refs, background=False)
                n += 1
            except Exception:  # noqa: BLE001 - attribution only; the environment runs regardless
                log.exception("re-registering environment %s with the lazy store failed", rec.id)
        return n

    def _start_lazy(self, spec: str) -> LazyStore:
        """A daemon on the node's mountpoint: `LazyStoreClient.start` clears a dead predecessor's
        stale mount, or the daemon takes a connection its fd-holder keeps over."""
        from rollstack.lazystore.client import LazyStoreClient
        from rollstack.lazystore.config import DaemonConfig

        lazy = self.config.lazy_dir
        end_orphan_daemon(lazy / "mnt", lazy / "state")
        return LazyStoreClient.start(DaemonConfig.of(lazy / "mnt", lazy / "state", spec, self.config.lazy))

    def _start_provisioner(self, on_terminate: Callable[..., None]) -> Provisioner:
        from rollstack.provision.detect import detect_backend
        from rollstack.provision.config import NodeCapacity, PolicyConfig
        from rollstack.provision.controller import Provisioner

        cfg = self.config
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        capacity = NodeCapacity(
            cpu=float(cfg.capacity_cpu or os.cpu_count() or 1),
            memory=int(cfg.capacity_memory or max(ram - cfg.reserve_memory, 1 << 30)),
        )
        policy = PolicyConfig(cpu_overcommit=cfg.cpu_overcommit)
        provisioner = Provisioner(detect_backend(), policy, capacity, on_terminate=on_terminate,
                                  held_memory=self.forks.memory_used)  # the fork store's tmpfs
        self.forks.headroom = provisioner.free_memory
        return provisioner.start()

    def stop(self) -> None:
        for pool in (self.warm, self.late):  # sandboxes stack the lazy store's dirs: before it stops
            if pool is not None:
                pool.stop()
        self.warm = self.late = None
        adopted_daemon = self.lazy is not None and self.lazy.process is None
        for name in ("provisioner", "lowers", "lazy"):
            part = getattr(self, name)
            if part is None:
                continue
            try:
                part.stop()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("stopping the %s failed", name)
            setattr(self, name, None)
        if self.runtime is not None:
            self.runtime.close()  # the warm network pool's unclaimed slots
        try:
            self.forks.stop()  # its tmpfs, once no layer is left in it
        except Exception:  # noqa: BLE001 - doctor reclaims a mount left below the root
            log.exception("unmounting the fork layers' tmpfs failed")
        if adopted_daemon:  # not our child: stop() cannot wait for it, so wait here
            end_orphan_daemon(self.config.lazy_dir / "mnt", self.config.lazy_dir / "state")
        for name in ("store",):
            part = getattr(self, name)
            close = getattr(part, "close", None)
            if close is not None:
                close()

    # -- admission ----------------------------------------------------------------------------

    def admit(self, env_id: str, plan: Plan) -> None:
        """Raises InsufficientCapacity when the provisioner cannot reserve the plan's start quotas."""
        if self.provisioner is None:
            return
        if not self.provisioner.admit(plan.resources.cpu, plan.resources.memory):
            raise InsufficientCapacity(f"not enough node capacity for {plan.resources.cpu} cores, {plan.resources.memory} bytes")

    # -- create / teardown ----------------------------------------------------------------------

    def prepare(self, plan: Any, timings: Timings | None = None, count: int = 1) -> Prepared:
        """The work every environment of one plan shares: resolve, the layers' TOCs, the lowers.
        `count` creates (a GRPO group) do it once; the lowers come from `Lowers.prepare`
        (which may wait for the layers' EROFS mounts: rollstack.lowers.stack)."""
        t = time.perf_counter()
        stack = self.resolver.resolve(plan)
        t_resolved = time.perf_counter()
        refs = list(stack.layers)
        self.lazy_call(lambda lazy: lazy.add_layers(refs))
        if plan.fetch.eager:
            self.lazy_call(lambda lazy: lazy.fetch_all(refs))
        lowers = self.lowers.prepare(refs, count) if self.lowers is not None else \
            [Path(self.lazy.layer_dir(r.digest)) for r in reversed(refs)]  # top first
        if timings is not None:
            timings.resolve = round(t_resolved - t, 6)
            timings.toc = round(time.perf_counter() - t_resolved, 6)
        return Prepared(stack, refs, lowers)

    def build(self, rec: EnvRecord, timings: Timings, prepared: Prepared | None = None) -> Built:
        """Resolve, ensure layers (unless `prepared`), mount + mutate + start; fills the timings."""
        from rollstack.run.ocispec import SpecParams

        from rollstack.node.netplan import harness_env, network_spec, new_token

        plan = rec.plan
        net = network_spec(plan, reserved_node_ports=self._reserved_ports())  # names resolve now
        token = new_token() if net.needs_netns else ""
        shared = prepared or self.prepare(plan, timings)
        stack, refs, lowers, group = shared.stack, shared.refs, shared.lowers, shared.group
        # a group took its warm sandboxes and began its environments in the lazy store at once
        warm = self._take_warm(rec, plan, net, refs, lowers) if group is None else group.warm.pop(rec.id, None)
        if group is None or rec.id not in group.begun:
            t = time.perf_counter()
            trace_key, stack_key = trace_keys(stack.stack_digest, plan)
            self.lazy_call(lambda lazy: lazy.begin_env(
                rec.id, refs, background=plan.fetch.background and not plan.fetch.eager,
                trace_key=trace_key, fallback_key=stack_key))
            timings.toc = round(timings.toc + time.perf_counter() - t, 6)
        mutate = group.mutate if group is not None else _mutator(plan)  # a group's: planned once

        params = SpecParams(
            env_id=rec.id,
            cwd=plan.workdir,
            env=harness_env(plan, net, token, internal=rec.internal),
            cpu=plan.resources.cpu,
            memory=plan.resources.memory,
            volumes=tuple((str(self.volumes.data(m.name)), m.path, m.read_only) for m in plan.volumes),
        )
        if warm is not None and warm.meta().get("late_root"):  # bound by its group (fanout), or now
            if lateroot.unbound(warm) and self.bind_late({rec.id: rec}, lowers, shared.fork_layers, mutate):
                warm = None  # destroyed: created cold below
            if warm is not None:
                from rollstack.node.warm import handout

                h = warm.net  # the gateway is known once a slot is claimed (as the runtime does)
                exec_env = {k: v.replace(GATEWAY_REF, h.gateway) if h is not None else v
                            for k, v in params.env.items()}
                handout(warm, plan, exec_env, mutated=True,  # workdir, exec defaults
                        workdir_there=group is not None and group.workdir_there)
        elif warm is not None:
            from rollstack.node.warm import handout

            warm.timings = {"mutation": handout(warm, plan, dict(params.env), mutate)}  # mount, start: before
        if warm is not None:
            env = warm
            timings.warm = True
            if self.provisioner is None:  # register below applies them otherwise
                env.update(cpu=plan.resources.cpu, memory=plan.resources.memory)
        else:
            env = self.runtime.create(rec.id, lowers, params, before_start=mutate, network=net,
                                      runtime=plan.runtime, userns=plan.security.userns,
                                      fork_layers=shared.fork_layers)
        timings.mount = round(env.timings.get("mount", 0.0), 6)
        timings.mutation = round(env.timings.get("mutation", 0.0), 6)
        timings.start = round(env.timings.get("start", 0.0), 6)
        rec.runtime = env
        rec.net_spec = net
        rec.fork_layers = list(shared.fork_layers)
        if self.provisioner is not None:
            r = plan.resources
            # Admission is checked again here, under the provisioner's lock: concurrent creates
            # that all passed `admit` cannot over-commit the node together.
            self.provisioner.register(rec.id, f"{CGROUP_PARENT}/{rec.id}", r.cpu, r.memory, r.max_cpu, r.max_memory)
        if self.lowers is not None:
            self.lowers.used(refs)
        # a warm sandbox's start read under another id: nothing was read under this one yet
        fetch = self._fetch_stats(rec.id) if warm is None else dict.fromkeys(_FETCH_KEYS, 0)
        fetch["stack_bytes"] = int(sum(int(r.size) for r in refs))
        h = env.net
        network = None if h is None else {
            "mode": net.mode, "address": h.address, "gateway": h.gateway, "token": token,
            "endpoints": [e.replace("${ROLLSTACK_GATEWAY}", h.gateway) for e in net.endpoints],
            "expose": list(net.expose)}
        return Built(runtime=env, refs=refs, stack_digest=stack.stack_digest, fetch=fetch,
                     network=network)

    def _attach_network(self, rec: EnvRecord, env: Any, net: Any) -> bool:
        """Give a bound late-bound sandbox the plan's network as a cold create with a user
        namespace gets it after its start: a claimed slot whose veth moves into the sandbox's
        own network namespace (runc made it at the sandbox's start: loopback only), the policy
        loaded, the allowed names in /etc/hosts. False when that failed: the sandbox is destroyed
        (its teardown takes the slot back) and the record left without a runtime, to be built
        cold under the same id; a destroy that fails raises (the record keeps the sandbox, as
        `bind_late` does)."""
        from rollstack.run.files import SafeRoot
        from rollstack.run.network import add_hosts
        from rollstack.run.userns import HOST_BASE

        assert self.runtime is not None
        network = self.runtime.network
        try:
            handle = network.claim(f"{self.runtime.root}:{env.id}")
        except Exception as e:  # noqa: BLE001 - the pool is exhausted: a cold create says so
            log.warning("late-bound sandbox %s: no network slot (%s); creating it cold", env.id, e)
            self._drop_late(rec, env)
            return False
        try:
            try:
                env._write_meta({**env.meta(), "net": handle.to_dict()})  # how destroy finds the slot
            except BaseException:
                network.teardown(handle)
                raise
            if net.hosts:
                add_hosts(SafeRoot(env.rootfs, HOST_BASE if env.meta().get("userns") else 0), net)
            pid = env.pid or env._init_pid()
            if pid is None:
                raise EnvironmentGone(f"late-bound sandbox {env.id} has no init process")
            network.setup(handle, net, attach_pid=pid)
        except Exception as e:  # noqa: BLE001 - reported, and the child created cold
            log.warning("late-bound sandbox %s: its network failed (%s); creating it cold", env.id, e)
            self._drop_late(rec, env)
            return False
        return True

    def _drop_late(self, rec: EnvRecord, env: Any) -> None:
        """A taken late-bound sandbox that cannot serve (counted as a failed bind by
        `bind_late`): destroyed, its record left without a runtime (built cold)."""
        env.destroy()  # raises: the record keeps it, its release retries
        rec.runtime = None

    def bind_late(self, recs: dict[str, EnvRecord], lowers: list[Path], fork_layers: list[Path],
                  mutate: Callable[[Path], None] | None) -> list[str]:
        """Bind the late-bound sandboxes the records took (rollstack.run.lateroot.bind_many; with
        the exec defaults `build`'s handout would write: one meta.json write each), then give
        each its network if the plan has one (`_attach_network`, all at once on the bind
        threads), and return the ids whose bind or network failed: each of those sandboxes is
        destroyed and its record left without a runtime, to be built cold under the same id."""
        from rollstack.node.netplan import harness_env, network_spec

        envs = [r.runtime for r in recs.values() if r.runtime is not None]
        rec0 = next(iter(recs.values()))
        plan = rec0.plan
        net = network_spec(plan, reserved_node_ports=self._reserved_ports())  # the token and gateway: at handout
        defaults = (plan.workdir, harness_env(plan, net, "", internal=rec0.internal))
        failed = lateroot.bind_many(envs, lowers, fork_layers, before_start=mutate, exec_defaults=defaults)
        out = list(failed)
        try:
            errors = []
            for env_id, err in failed.items():
                log.warning("late-bound sandbox %s: binding its root failed (%s); creating it cold", env_id, err)
                env = recs[env_id].runtime
                if env is not None:
                    try:
                        env.destroy()
                    except Exception as e:  # noqa: BLE001 - the record keeps it: its release retries
                        errors.append(e)
                        continue
                recs[env_id].runtime = None
            if errors:
                raise errors[0]  # the fork fails, typed; every sandbox left is still its record's
            if net.needs_netns:  # every bound one's network at once: each is mostly `ip` and `nft` waits
                bound = [r for r in recs.values() if r.id not in failed and r.runtime is not None]
                results = list(lateroot.workers().map(lambda r: _attempt(self._attach_network, r, r.runtime, net),
                                                      bound))
                out += [r.id for r, (ok, _) in zip(bound, results) if not ok]
                raised = [e for _, e in results if e is not None]
                if raised:
                    raise raised[0]  # a destroy failed: as above
            return out
        finally:  # each taken sandbox counted once toward the breaker: bound, or failed (its bind or its network)
            if self.late is not None:
                self.late.bound(len(envs) - len(out), len(out))

    def fork_source(self, rec: EnvRecord) -> Prepared:
        """What a fork's children share: the parent's upper frozen into a layer (the parent
        paused for the copy, under its lock: no file call or destroy runs meanwhile) on top of
        its lowers. The layer is pending (never collected) until `ForkLayers.settle`."""
        from rollstack.node import record as st

        with rec.lock:
            if rec.state != st.RUNNING or rec.runtime is None:
                raise EnvironmentGone(f"environment {rec.id} is {rec.state}: it cannot be forked")
            if rec.paused:  # paused since the caller looked: a cut would thaw (or miss) it
                raise EnvironmentPaused(f"environment {rec.id} is paused: resume it first")
            env = rec.runtime
            layer, cut = self.forks.freeze(env)
            lowers, forks = env.lowers, env.fork_layers
        stack = ForkedStack(rec.created.stack_digest if rec.created is not None else None)
        return Prepared(stack, list(rec.refs), [layer, *lowers], fork_layers=[layer, *forks], fork=cut)

    def snapshot(self, rec: EnvRecord, name_tag: str) -> dict[str, Any]:
        """Publish `rec`'s filesystem now as plan `NAME:TAG` over group `NAME-fs:TAG` (its
        changes, one seekable layer) in the node's store. The environment is frozen only for the
        copy of its changes; conversion and upload run after it is thawed. Nothing is published
        unless all of it is (the plan's manifest goes last)."""
        import tempfile

        from rollstack.errors import AlreadyExists, TemplateNotFound
        from rollstack.node import record as st
        from rollstack.plan.groups import publish_group, split_name_tag
        from rollstack.plan.published import load_published, publish_plan
        from rollstack.plan.snapshots import KIND, group_of, source_desc
        from rollstack.run.snapshot import tree_size

        name, tag = split_name_tag(name_tag)  # InvalidRequest for a hostile or malformed name
        group = group_of(name_tag)
        assert self.store is not None
        try:
            load_published(self.store, f"{name}:{tag}")
        except TemplateNotFound:
            pass
        else:
            raise AlreadyExists(f"a plan {name}:{tag} exists already: pick another tag")
        t0 = time.perf_counter()
        self.forks.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="snapshot-", dir=self.forks.root.parent) as tmp:
            copy = Path(tmp) / "changes"
            with rec.lock:
                if rec.state != st.RUNNING or rec.runtime is None:
                    raise EnvironmentGone(f"environment {rec.id} is {rec.state}: it cannot be snapshotted")
                env = rec.runtime
                if rec.paused:
                    env.changes_copy(copy)
                else:
                    with env.cut():
                        env.changes_copy(copy)
            files = int(tree_size(copy)["files"])
            published = publish_group(self.store, group, [copy], kind=KIND, work_dir=Path(tmp),
                                      source_desc=source_desc(rec.id))
        doc = rec.plan.model_dump(mode="json", exclude_none=True)
        doc.update(name=name, groups=[*rec.plan.groups, group])
        doc.pop("mutation", None)
        doc.pop("mutation_text", None)  # the task's changes are in the snapshot's layer
        publish_plan(self.store, f"{name}:{tag}", doc)
        layer = published.layers[0]
        return {"plan": f"{name}:{tag}", "group": group, "layer": layer["digest"], "bytes": int(layer["size"]),
                "files": files, "seconds": round(time.perf_counter() - t0, 6),
                "trace_chunks": self._share_trace(rec, doc, f"{name}:{tag}")}

    def _share_trace(self, rec: EnvRecord, doc: dict[str, Any], name_tag: str) -> int:
        """What `rec` read from its layers, stored and published as the access traces of the
        snapshot's stack (the task and stack keys of `doc`, its published plan), so a node
        starting from the snapshot prefetches it; best effort (0: nothing shared)."""
        from rollstack.plan.model import load_plan

        assert self.resolver is not None
        try:
            plan = load_plan(doc)
            keys = [k for k in trace_keys(self.resolver.resolve(plan).stack_digest, plan) if k]
            return int(self.lazy_call(lambda lazy: lazy.share_trace(rec.id, keys))) if keys else 0
        except Exception:  # noqa: BLE001 - the snapshot is published; only its prefetch is lost
            log.exception("sharing the access trace of %s with snapshot %s failed", rec.id, name_tag)
            return 0

    def network_plan(self, rec: EnvRecord, network: Any) -> tuple[Plan, NetworkSpec]:
        """`rec`'s plan with `network` (validated: PlanInvalid naming it) and its resolved spec
        (names looked up now: call it without holding the record's lock)."""
        from rollstack.node.netplan import network_spec
        from rollstack.plan.model import load_plan
        from rollstack.plan.published import plan_document

        plan = load_plan({**plan_document(rec.plan), "network": network})
        return plan, network_spec(plan, reserved_node_ports=self._reserved_ports())

    def set_network(self, rec: EnvRecord, spec: NetworkSpec) -> None:
        """Apply `spec` (from `network_plan`) to `rec`'s network namespace, all or nothing (the
        policy it had, `rec.net_spec`, is put back if the rest fails)."""
        assert rec.runtime is not None and rec.net_spec is not None
        rec.runtime.set_network(spec, rec.net_spec)
        rec.net_spec = spec

    def _reserved_ports(self) -> tuple[int, ...]:
        return (self.config.host_port()[1],)

    def _take_warm(self, rec: EnvRecord, plan: Plan, net: Any, refs: list[Any],
                   lowers: list[Path]) -> Environment | None:
        """A warm sandbox for this plan (the record takes its id), or None: create cold."""
        from rollstack.node.warm import eligible

        if self.warm is None or self.rekey is None or not eligible(plan, net):
            return None
        env = self.warm.take([r.digest for r in refs], lowers, plan.workdir)
        if env is not None:
            self.rekey(rec, env.id)
            rec.runtime = env  # a failing handout tears it down with the record
        return env

    def _lowers_changed(self) -> None:
        """A layer got a faster lower (an EROFS mount or a local copy): the warm pool refills on
        the new dirs (its sandboxes on the old ones serve until replaced if `fast_lowers`)."""
        warm, lowers = self.warm, self.lowers
        if warm is not None and lowers is not None:
            warm.relower(lowers.stack)

    def fast_lowers(self, lowers: Sequence[str]) -> bool:
        """Each of `lowers` is an EROFS mount or a local copy (rollstack.lowers.stack.Lowers.fast)."""
        return self.lowers.fast(lowers) if self.lowers is not None else False

    def _fetch_stats(self, env_id: str) -> dict[str, int]:
        try:
            doc = self.lazy.env_stats(env_id) or {}
        except Exception:  # noqa: BLE001 - statistics must never fail a create
            log.exception("env_stats(%s) failed", env_id)
            doc = {}
        return {k: int(doc.get(k, 0) or 0) for k in _FETCH_KEYS}

    def release(self, rec: EnvRecord) -> None:
        """The cheap, immediate part of an asynchronous destroy: leave the provisioner (its
        quotas no longer count for admission) and SIGKILL the environment's PID 1 (the kernel
        then kills its whole pid namespace). `teardown` does the rest later."""
        if self.provisioner is not None:
            _try([], self.provisioner.unregister, rec.id)
        if rec.runtime is not None:
            _try([], rec.runtime.kill_init)
            if rec.paused and not rec.checkpointed:  # a frozen process dies of its SIGKILL once thawed
                _try([], rec.runtime.resume)

    def pause(self, rec: EnvRecord, mode: str = "freeze") -> dict[str, float]:
        """Freeze `rec`'s processes (or checkpoint them: rollstack.run.checkpoint), then give its
        quotas back to admission. A checkpoint leaves the provisioner first (its cgroup goes
        with the processes) and rejoins it if CRIU refuses (the environment runs on)."""
        assert rec.runtime is not None
        if mode != "checkpoint":
            rec.runtime.pause()
            if self.provisioner is not None:
                self.provisioner.unregister(rec.id)
            return {}
        from rollstack.run.checkpoint import checkpoint

        criu = self._criu()
        if rec.runtime.runtime_name == "runc":  # what the restore gives its cgroup: the plan's
            rec.runtime.set_spec_quotas(rec.plan.resources.cpu, rec.plan.resources.memory)
        if self.provisioner is not None:
            self.provisioner.unregister(rec.id)
        try:
            return checkpoint(rec.runtime, criu)
        except BaseException:
            if self.provisioner is not None:
                self._register(rec, check_admission=False)
            raise

    def resume(self, rec: EnvRecord) -> dict[str, float]:
        """Take `rec`'s quotas back through admission (InsufficientCapacity: it stays paused),
        then thaw it (or restore its checkpoint)."""
        assert rec.runtime is not None
        if self.provisioner is not None:
            self._register(rec)
        try:
            if not rec.checkpointed:
                rec.runtime.resume()
                return {}
            from rollstack.run.checkpoint import restore

            return restore(rec.runtime, self._criu())
        except BaseException:
            if self.provisioner is not None:
                self.provisioner.unregister(rec.id)
            raise

    def _register(self, rec: EnvRecord, check_admission: bool = True) -> None:
        assert self.provisioner is not None
        r = rec.plan.resources
        self.provisioner.register(rec.id, f"{CGROUP_PARENT}/{rec.id}", r.cpu, r.memory, r.max_cpu, r.max_memory,
                                  check_admission=check_admission)

    @staticmethod
    def _criu() -> str:
        from rollstack.run.checkpoint import find_criu

        criu = find_criu()
        if criu is None:
            raise InvalidRequest("checkpoints need CRIU, which this node lacks (`make setup` builds it: "
                                 "third_party/criu/build.sh)")
        return criu

    def teardown(self, rec: EnvRecord) -> None:
        """Undo whatever part of `build` happened. Raises if something could not be reclaimed."""
        errors: list[BaseException] = []
        if self.provisioner is not None:
            _try([], self.provisioner.unregister, rec.id)  # may never have been registered
        env = rec.runtime
        if env is None and self.runtime is not None:
            from rollstack.run.environment import Environment

            env = Environment(self.runtime, rec.id)  # a create that failed half-way
        if env is not None:
            if rec.paused:  # frozen processes cannot die: thaw them for their end
                _try([], env.resume)
            _try(errors, env.destroy)
        if self.lazy is not None:
            _try([], self.lazy.end_env, rec.id)  # may never have begun
        if errors:
            raise errors[0]

    # -- use ----------------------------------------------------------------------------------

    def exec(self, rec: EnvRecord, req: ExecRequest, on_output: OnOutput | None,
             control: ExecControl | None = None) -> ExecResult:
        extra = {} if control is None else {"control": control}
        return rec.runtime.exec(req.resolved_argv(), on_output=on_output, **self._exec_options(req), **extra)

    async def exec_async(self, rec: EnvRecord, req: ExecRequest, offload: Any) -> ExecResult:
        """`exec` on the caller's event loop (rollstack.run.handle.Environment.exec_async)."""
        assert rec.runtime is not None
        return await rec.runtime.exec_async(req.resolved_argv(), offload=offload, **self._exec_options(req))

    def _exec_options(self, req: ExecRequest) -> dict[str, Any]:
        """A request's cwd, env, stdin, timeout and the node's output cap, as the runtime takes them."""
        return {"cwd": req.cwd, "env": req.env or None,
                "stdin": req.stdin.encode() if req.stdin is not None else None,
                "timeout": req.timeout, "output_limit": self.config.exec_output_limit}

    def oom_kills(self, rec: EnvRecord) -> int:
        """Processes the kernel's OOM killer ended in the environment so far (a cheap file read)."""
        if rec.oom_file is None:
            rec.oom_file = oom_counter_file(rec.id, CGROUP_PARENT)
            if rec.oom_file is None:
                return 0
        try:
            return oom_kill_count(rec.oom_file.read_text())
        except OSError:  # the cgroup is gone: the environment is being torn down
            return 0

    def read_file(self, rec: EnvRecord, path: str) -> bytes:
        files, inner, _ = self._files_of(rec, path)
        return self._read(files, inner)

    def write_file(self, rec: EnvRecord, path: str, data: bytes) -> None:
        files, inner, _ = self._files_of(rec, path, write=True)
        self._write(files, inner, data)

    def read_volume_file(self, name: str, path: str) -> bytes:
        return self._read(self.volume_root(name), path)

    def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        self._write(self.volume_root(name), path, data)

    def _read(self, files: Any, path: str) -> bytes:
        limit = self.config.max_file_bytes
        data = files.read_file(path, limit=limit + 1)
        if len(data) > limit:
            raise InvalidRequest(f"{path} is larger than the files API limit of {limit} bytes")
        return data

    def _write(self, files: Any, path: str, data: bytes) -> None:
        if len(data) > self.config.max_file_bytes:
            raise InvalidRequest(f"{len(data)} bytes exceed the files API limit of {self.config.max_file_bytes}")
        files.write_file(path, data)

    def volume_root(self, name: str) -> Any:
        """Volume `name`'s files, confined to it (rollstack.run.fsops.TreeRoot; ids as stored)."""
        from rollstack.run.fsops import TreeRoot

        return TreeRoot(self.volumes.data(name))

    def _files_of(self, rec: EnvRecord, path: str, write: bool = False, tree: bool = False) -> tuple[Any, str, str]:
        """Where an environment path is: (files, path in them, mount point) of a mounted volume,
        or of the environment's own root (mount point ""; a TreeRoot of it for `tree`). Writes
        into a read-only mount are refused."""
        from rollstack.node.volumes import route_path
        from rollstack.run.fsops import TreeRoot
        from rollstack.run.userns import id_base_of

        mount, inner = route_path(rec.plan.volumes, path)
        if mount is None:
            root = rec.runtime.files.root
            return (TreeRoot(root, id_base_of(root)) if tree else rec.runtime.files), path, ""
        if write and mount.read_only:
            raise InvalidRequest(f"{mount.path} is volume {mount.name!r} mounted read-only")
        return self.volume_root(mount.name), inner, mount.path

    def tree(self, rec: EnvRecord, op: str, *args: Any) -> Any:
        """A directory operation (rollstack.run.fsops.TreeRoot) on an environment's paths,
        inside a mounted volume where a path is in one (entries' paths as the environment sees
        them); a move between a volume and the rest of the tree is refused."""
        n = 2 if op == "move" else 1
        routed = [self._files_of(rec, p, write=op not in ("entry", "walk"), tree=True) for p in args[:n]]
        if len({mount for _, _, mount in routed}) > 1:
            raise InvalidRequest(f"cannot move {args[0]} to {args[1]}: across a volume mount")
        files, _, mount = routed[0]
        out = getattr(files, op)(*[inner for _, inner, _ in routed], *args[n:])
        return _under(out, mount) if mount else out

    def has_path(self, rec: EnvRecord, path: str) -> bool:
        files, inner, _ = self._files_of(rec, path)
        try:
            return bool(files.exists(inner))
        except UnsafePath:  # an absolute symlink: it is there, we just do not follow it
            return True

    def diff(self, rec: EnvRecord, binary: str = "name") -> str:
        return rec.runtime.diff(base=DIFF_BASE, binary=binary)

    # -- provisioning -------------------------------------------------------------------------

    def quotas(self, env_id: str) -> Quotas | None:
        if self.provisioner is None:
            return None
        try:
            q = self.provisioner.quotas(env_id)
        except EnvironmentNotFound:  # not (or no longer) provisioned
            return None
        return Quotas(cpu_limit=q.get("cpu"), memory_limit=q.get("memory"))

    def kill(self, rec: EnvRecord) -> None:
        """Kill every process of the environment (its mounts and state stay for destroy)."""
        if rec.runtime is not None:
            rec.runtime.engine.kill(rec.id, "KILL", all_processes=True)

    def _history(self, env_id: str) -> list[dict[str, Any]]:
        if self.provisioner is None:
            return []
        try:
            return [_as_dict(s) for s in self.provisioner.history(env_id)]
        except EnvironmentNotFound:  # not (or no longer) provisioned: no history
            return []

    def history(self, env_id: str) -> tuple[list[Sample], list[dict[str, Any]]]:
        samples = [Sample.model_validate(s) for s in self._history(env_id)]
        events: list[dict[str, Any]] = []
        if self.provisioner is not None:
            try:
                events = [_as_dict(e) for e in self.provisioner.events(env_id)]
            except EnvironmentNotFound:
                events = []
        return samples, events

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.lazy is not None:
            try:
                stats = self.lazy.stats() or {}
            except Exception:  # noqa: BLE001 - metrics never fail a scrape; the gap is logged
                log.warning("lazy store stats failed; /metrics goes without them", exc_info=True)
                stats = {}
            out.update(flatten(stats, "lazy"))
        if self.lowers is not None:
            out.update(self.lowers.metrics())
        for pool in (self.warm, self.late):
            if pool is not None:
                out.update(pool.stats())
        out["agent_rss_bytes"] = float(_rss())
        return out


def _mutator(plan: Plan) -> Callable[[Path], None] | None:
    if not plan.mutation_text:
        return None
    from rollstack.plan.mutation import apply_mutation

    text, workdir = plan.mutation_text, plan.workdir

    def apply(rootfs: Path) -> None:
        apply_mutation(rootfs, text, workdir=workdir)

    return apply


def _try(errors: list[BaseException], fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - collected, the first one re-raised by the caller
        log.warning("teardown step %s failed: %s", getattr(fn, "__name__", fn), exc)
        errors.append(exc)


def _as_dict(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if hasattr(item, "model_dump"):
        return item.model_dump()
    if hasattr(item, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(item)
    return dict(vars(item))


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _node_tag(root: Path) -> str:
    """A short name for this node's host resources (its background cgroup), from its root."""
    return hashlib.sha256(os.fsencode(str(Path(root).resolve()))).hexdigest()[:12]


def _attempt(fn: Callable[..., bool], *args: Any) -> tuple[bool, BaseException | None]:
    """`fn(*args)` in a worker thread: (its answer, None), or (False, what it raised)."""
    try:
        return fn(*args), None
    except BaseException as e:  # noqa: BLE001 - handed back to the calling thread
        return False, e
