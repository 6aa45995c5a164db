"""`NodeService`: the one place that strings the stages together, for many environments at once.

create = admission -> resolve -> lazy store (TOCs; or a full fetch when the plan says eager) ->
overlay + mutation + spec + runc (`rollstack.run.environment`) -> register with the provisioner,
each phase timed. Also exec (plain and streaming), files, diff, evaluate, stats, destroy, list;
a reaper for environments past their lifetime or whose lease lapsed (`renew` keeps a lease
alive), which also retries failed teardowns until clean; idempotent creates (a key -> the same
environment, `node.idempotency`); recovery of a previous run's leftovers on start; a graceful
stop that destroys everything this service owns.

Concurrency: every method blocks and is safe to call from many threads at once. A registry lock
guards only the id -> record map and admission counting (never held across I/O); each record has
its own lock that destroy holds, so creates, execs and destroys of different environments run in
parallel, and an exec never holds a lock (a long command must not block destroy).

Size (~550 lines): one class whose methods are the node API's operations, each a short
orchestration over `Stages`; splitting it would split the one place the stages meet.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from pathlib import Path
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from functools import partial
from typing import Any, Iterator

from rollstack.errors import (
    EnvironmentGone,
    EnvironmentNotFound,
    InsufficientCapacity,
    InvalidRequest,
    NodeUnavailable,
    EnvironmentPaused,
    OomTerminated,
    PlanInvalid,
    RollstackError,
    RuntimeFailure,
    VolumeBusy,
)
from rollstack.node import record as st
from rollstack.node import recovery
from rollstack.node.config import NodeConfig
from rollstack.node.counters import Counters
from rollstack.node.execution import stream, to_wire
from rollstack.node.idempotency import IdempotencyKeys, fingerprint
from rollstack.contract.models import (
    CreateResponse,
    EnvironmentInfo,
    Evaluation,
    ExecChunk,
    ExecRequest,
    ExecResult,
    FetchStats,
    Health,
    MAX_LEASE,
    LeaseRenewal,
    Quotas,
    Snapshot,
    SnapshotInfo,
    Stats,
    Timings,
    VolumeInfo,
)
from rollstack.node.record import EnvRecord
from rollstack.node.stages import Stages

log = logging.getLogger(__name__)

TREE_OPS = frozenset({"entry", "walk", "make_dir", "move", "remove", "set_attrs"})
"""The directory operations `tree` runs (rollstack.run.fsops.TreeRoot)."""
VOLUME_DELETE_WAIT = 60.0
"""Seconds a volume delete waits for the teardowns of environments being destroyed that mount it."""
BUILD_WAIT = 600.0
"""Seconds a destroy waits for the create still building its environment."""
PAUSE_SETTLE_S = 330.0
"""Seconds a failed exec waits for a pause in progress to be recorded (a checkpoint's CRIU call
times out after 300 s) before it reports its own error."""
TRIM_INTERVAL = 60.0
"""Seconds between the reaper's malloc_trim calls (rollstack.host.libc.malloc_trim)."""
_TOMBSTONES = 4096
"""Destroyed ids remembered so that a repeated destroy is a no-op, not a 404."""
_RETRY_FIRST = 1.0
"""Seconds before the first retry of a failed teardown (doubling up to `destroy_retry_max`)."""


class NodeService:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._envs: dict[str, EnvRecord] = {}
        self._gone: dict[str, str] = {}  # destroyed id -> final state
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self.stages: Stages | None = None
        self._destroyer = ThreadPoolExecutor(max_workers=config.destroy_workers,
                                             thread_name_prefix="rollstack-destroy")
        self._destroys: set[Future] = set()
        self._keys = IdempotencyKeys(config.idempotency_ttl, config.idempotency_keys)
        self.started_at = time.time()
        self.counters = Counters(("created", "destroyed", "forks", "create_failures", "execs", "evaluations", "reaped",
                                  "lease_expired", "timeout_paused", "destroy_failures", "lazy_daemon_restarts"))

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Clean up a previous run's leftovers, start the lazy store, provisioner and reaper."""
        self.stages = Stages.start(self.config, on_terminate=self._on_terminate)
        for env, doc in self.stages.adopted:
            self._adopt(env, doc)
        from rollstack.node.warm import attach

        attach(self)  # NodeConfig.warm_pool: started sandboxes handed out at create
        self._reaper = threading.Thread(target=self._reap_loop, name="rollstack-reaper", daemon=True)
        self._reaper.start()
        self._watcher = threading.Thread(target=self._watch_loop, name="rollstack-lazy-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Destroy every environment this service owns, then stop the stages. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            ids = list(self._envs)
        if ids:
            with ThreadPoolExecutor(max_workers=min(16, len(ids))) as pool:
                list(pool.map(self._destroy_quietly, ids))
        self._destroyer.shutdown(wait=True)  # background destroys finish before the stages stop
        for t in (self._reaper, self._watcher):
            if t is not None:
                t.join(timeout=10)
        if self.stages is not None:
            self._collect_forks()  # what no environment stacks now, before the fork store stops
            self.stages.stop()

    def _adopt(self, env: Any, doc: dict[str, Any]) -> None:
        from rollstack.plan.model import load_plan

        age = max(0.0, time.time() - float(doc.get("started_at", time.time())))
        rec = EnvRecord(id=env.id, plan=load_plan(doc["plan"]), timeout=float(doc["timeout"]),
                        state=st.RUNNING, runtime=env, started_at=time.time() - age,
                        started_mono=time.monotonic() - age, fork_layers=env.fork_layers)
        rec.renew(doc.get("lease"))  # a full lease from now: the client gets to renew it
        rec.paused = bool(doc.get("paused"))
        rec.checkpointed = rec.paused and bool(doc.get("checkpointed"))
        rec.on_timeout = "pause" if doc.get("on_timeout") == "pause" else "destroy"
        rec.timeout_paused = bool(doc.get("timeout_paused"))
        rec.event("adopted")
        if doc.get("destroying"):  # its destroy had failed: finish it, never serve it again
            rec.state, rec.final, rec.teardown_failures = st.DESTROYING, st.DESTROYED, 1
        with self._lock:
            self._envs[env.id] = rec
        log.info("re-adopted environment %s (age %.0fs)", env.id, age)

    def _pause_on_timeout(self, rec: EnvRecord) -> bool:
        """The reaper's end of an `on_timeout: pause` lifetime: pause it; it then lives
        `paused_ttl` more, paused (a resume with a new timeout gives it its lifetime back). A
        pause that fails is tried at the next reaps; after `_PAUSE_TRIES` failures it is False:
        the caller destroys it like any expired environment."""
        log.info("environment %s reached its timeout; pausing (on_timeout: pause)", rec.id)
        try:
            if not rec.paused:  # paused already (frozen or checkpointed by its client): kept so
                self.pause(rec.id)
        except Exception as exc:  # noqa: BLE001 - counted; the reaper goes on
            rec.pause_failures += 1
            log.warning("pausing %s at its timeout failed (%d of %d): %s", rec.id, rec.pause_failures,
                        _PAUSE_TRIES, exc)
            return rec.pause_failures < _PAUSE_TRIES
        rec.timeout_paused = True
        rec.timeout = rec.age() + self.config.paused_ttl
        rec.event("timeout_paused", paused_ttl=self.config.paused_ttl)
        self.counters.bump("timeout_paused")
        if not rec.internal:
            recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
        return True

    def _destroy_quietly(self, env_id: str) -> None:
        try:
            self.destroy(env_id, wait=True)
        except Exception:  # noqa: BLE001 - stop must go on; the next start's recovery cleans up
            log.exception("destroying %s during stop failed", env_id)

    def _stages(self) -> Stages:
        if self.stages is None or self._stopping.is_set():
            raise EnvironmentGone("the node service is not running")
        return self.stages

    # -- create -------------------------------------------------------------------------------

    def create(self, plan: dict[str, Any] | Any, lease: float | None = None,
               idempotency_key: str | None = None) -> CreateResponse:
        """One environment. `lease`: seconds within which the client renews it (`renew`), else
        it is reaped; `idempotency_key`: a retry with it returns the same environment."""
        lease = _check_lease(lease)

        def create() -> CreateResponse:
            loaded = self._load(plan)
            created = self._create(loaded, internal=False, rec=self._admit(loaded, False, lease))
            if loaded.setup:
                self._setup(created, loaded)
            return created

        if idempotency_key is None:
            return create()
        created = self._keys.run(idempotency_key, fingerprint(plan, None, lease), create)
        self.renew([created.id])  # a retry is a sign of life
        return created

    def create_many(self, plan: dict[str, Any] | Any, count: int, lease: float | None = None,
                    idempotency_key: str | None = None) -> list[CreateResponse]:
        """`count` environments of one plan in one call (a GRPO group), all or none; the shared
        work (resolve, layer TOCs) is done once (`rollstack.node.fanout`). `lease` and
        `idempotency_key` as in `create`."""
        from rollstack.node.fanout import create_group

        lease = _check_lease(lease)

        def create() -> list[CreateResponse]:
            loaded = self._load(plan)
            group = self._setup_once(loaded, count) if loaded.setup and count > 1 else None
            if group is None:
                group = create_group(self, loaded, count)
            if lease is not None:
                self.renew([c.id for c in group], lease)
            return group

        if idempotency_key is None:
            return create()
        group = self._keys.run(idempotency_key, fingerprint(plan, count, lease), create)
        self.renew([c.id for c in group])
        return group

    def _setup(self, created: CreateResponse, plan: Any) -> None:
        """Run the plan's setup commands in the new environment; one that fails destroys it
        and raises CommandFailed (with the tail of its output)."""
        from rollstack.errors import CommandFailed

        t = time.perf_counter()
        for command in plan.setup:
            try:
                r = self.exec(created.id, ExecRequest(command=command, timeout=plan.setup_timeout))
            except BaseException:
                self._destroy_quietly(created.id)
                raise
            if r.exit_code != 0 or r.timed_out:
                self._destroy_quietly(created.id)
                raise CommandFailed(f"setup command {command!r} exited {r.exit_code}"
                                    f"{' (timed out)' if r.timed_out else ''}: {(r.stderr or r.stdout)[-500:]}",
                                    exit_code=r.exit_code)
        created.timings.setup = round(time.perf_counter() - t, 6)
        created.timings.total = round(created.timings.total + created.timings.setup, 6)

    def _setup_once(self, plan: Any, count: int) -> list[CreateResponse]:
        """A group whose plan has setup commands: one environment runs them, the group is
        forked from it (each environment starts where the setup left the files), then that
        one is destroyed. Its setup and the fork count in every member's timings."""
        t = time.perf_counter()
        first = self._create(plan, internal=False, rec=self._admit(plan, False))
        try:
            self._setup(first, plan)
            group = self.fork(first.id, count)
        finally:
            self._destroy_quietly(first.id)
        total = round(time.perf_counter() - t, 6)
        for c in group:
            c.timings.setup = first.timings.setup
            c.timings.total = total
        return group

    def _load(self, plan: dict[str, Any] | Any) -> Any:
        from rollstack.plan.model import load_plan

        if isinstance(plan, str):  # a published plan, NAME:TAG (never a path on the node's disk)
            from rollstack.plan.published import load_published

            return load_published(self._stages().store, plan)
        if isinstance(plan, dict) and "extends" in plan:  # a published plan, fields replaced
            base = plan["extends"]
            if not isinstance(base, str):
                raise PlanInvalid("extends: a published plan's NAME:TAG")
            from rollstack.plan.published import plan_document

            plan = {**plan_document(self._load(base)), **{k: v for k, v in plan.items() if k != "extends"}}
        if isinstance(plan, dict) and plan.get("mutation") and plan.get("mutation_text") is None:
            # A mutation file path would be read on the node's disk: refuse; clients send it inline.
            text = str(plan["mutation"])
            if "\n" not in text:
                raise PlanInvalid("mutation: send the diff inline (mutation_text), not a file path")
        return load_plan(plan)

    def _create(self, plan: Any, internal: bool, rec: EnvRecord | None = None,
                prepared: Any = None) -> CreateResponse:
        """Build one environment; `rec` if already admitted, `prepared` if the shared work of
        its plan was done (`Stages.prepare`)."""
        stages = self._stages()
        rec = rec or self._admit(plan, internal)
        t0 = time.perf_counter()
        timings = Timings()
        try:
            built = stages.build(rec, timings, prepared)
            rec.runtime, rec.refs = built.runtime, built.refs
            timings.total = round(time.perf_counter() - t0, 6)
            rec.created = CreateResponse(
                id=rec.id,
                timings=timings,
                fetch=FetchStats(**built.fetch),
                stack_digest=built.stack_digest,
                layers=len(built.refs),
                network=built.network,
            )
            with rec.lock:
                if rec.state == st.DESTROYING:  # a destroy came while we built: it waits for us (built)
                    raise EnvironmentGone(f"environment {rec.id} was destroyed while it was being created")
                if rec.state == st.CREATING:
                    rec.state = st.RUNNING
                    rec.renew()  # the lease runs from the moment the client can use it
            rec.event("created", total=timings.total)
            if not internal:
                recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
            self.counters.bump("created")
            return rec.created
        except BaseException as exc:
            destroyed = rec.state == st.DESTROYING  # what made the build fail (its PID 1 killed)
            self.counters.bump("create_failures")
            try:
                self._teardown(rec, final=st.FAILED)
            except Exception:  # noqa: BLE001 - the create's own error is the one to report
                log.exception("cleaning up the failed create of %s failed", rec.id)
            if destroyed and isinstance(exc, Exception) and not isinstance(exc, EnvironmentGone):
                raise EnvironmentGone(f"environment {rec.id} was destroyed while it was being created") from exc
            raise
        finally:
            rec.built.set()

    def _admit(self, plan: Any, internal: bool, lease: float | None = None) -> EnvRecord:
        env_id = f"e{uuid.uuid4().hex[:12]}"
        timeout = float(plan.timeout or self.config.default_timeout)
        rec = EnvRecord(id=env_id, plan=plan, timeout=timeout, internal=internal, lease=lease)
        rec.built.clear()  # set by `_create` (or fanout's release of an unbuilt record)
        with self._lock:
            if self._stopping.is_set():  # stop() has listed what it destroys: admit nothing more
                raise NodeUnavailable("the node service is stopping")  # retryable: another node
            live = sum(1 for r in self._envs.values() if r.state in st.LIVE_STATES)
            if live >= self.config.max_environments:
                raise InsufficientCapacity(
                    f"node is full: {live} of {self.config.max_environments} environments"
                )
            self._check_volumes(plan)  # raises VolumeNotFound, VolumeBusy
            self._stages().admit(env_id, plan)  # raises InsufficientCapacity
            self._envs[env_id] = rec
        return rec

    def rekey(self, rec: EnvRecord, env_id: str) -> None:
        """Rename an admitted record before its id is returned (a warm sandbox's id, node.warm)."""
        with self._lock:
            self._envs.pop(rec.id, None)
            rec.id = env_id
            self._envs[env_id] = rec

    def live_count(self) -> int:
        with self._lock:
            return sum(1 for r in self._envs.values() if r.state in st.LIVE_STATES)

    # -- destroy ------------------------------------------------------------------------------

    def destroy(self, env_id: str, wait: bool | None = None) -> None:
        """Kill, runc delete, unmount, remove dirs and cgroup. Idempotent.

        Asynchronous unless `wait` (default: not `config.async_destroy`): the environment stops
        counting for admission, leaves the provisioner and has its processes killed at once; the
        rest (runc delete, cgroups, unmount, dirs) runs on a background thread. `stop()` and
        `wait_destroyed()` wait for those."""
        with self._lock:
            rec = self._envs.get(env_id)
            if rec is None:
                if env_id in self._gone:
                    return
                raise EnvironmentNotFound(f"no environment {env_id!r}")
        if wait if wait is not None else not self.config.async_destroy:
            self._await_build(rec)
            self._teardown(rec, final=st.DESTROYED)
            return
        with rec.lock:
            if rec.state in (st.DESTROYING, st.DESTROYED, st.FAILED):
                return
            terminated = rec.state == st.OOM_TERMINATED
            rec.state = st.DESTROYING
        if self.stages is not None:
            self.stages.release(rec)
        future = self._destroyer.submit(self._teardown_built, rec, terminated)
        with self._lock:
            self._destroys.add(future)
        future.add_done_callback(self._destroy_done)

    def _await_build(self, rec: EnvRecord) -> None:
        """Wait until no create is building `rec` (a destroy racing its create: the teardown
        would unmount what the build still mounts). The build's own steps are bounded; past
        BUILD_WAIT we tear down anyway (and say so)."""
        if not rec.built.wait(BUILD_WAIT):
            log.error("environment %s still building after %.0f s: tearing it down anyway", rec.id, BUILD_WAIT)

    def _teardown_built(self, rec: EnvRecord, terminated: bool) -> bool:
        self._await_build(rec)
        return self._teardown(rec, st.DESTROYED, terminated)

    def _destroy_done(self, future: Future) -> None:
        with self._lock:
            self._destroys.discard(future)
        if future.exception() is not None:  # the reaper retries it (_teardown_failed)
            log.error("background destroy failed: %s", future.exception())

    def wait_destroyed(self, timeout: float | None = None) -> bool:
        """Block until every background destroy has finished; False on timeout."""
        with self._lock:
            pending = list(self._destroys)
        done, not_done = futures_wait(pending, timeout=timeout)
        return not not_done

    def _teardown(self, rec: EnvRecord, final: str, terminated: bool | None = None) -> bool:
        """Reclaim everything of `rec`; True once clean. A failure leaves it `destroying`, listed
        and with its recovery record, and the reaper retries it (`_teardown_failed`); the first
        call's `final` state and OOM ending hold for the retries."""
        with rec.lock:
            if rec.state in (st.DESTROYED, st.FAILED):
                return True
            if rec.final is None:
                rec.final = final
                rec.terminated = rec.state == st.OOM_TERMINATED if terminated is None else terminated
            rec.state = st.DESTROYING
            try:
                if self.stages is not None:
                    self.stages.teardown(rec)
            except BaseException as exc:
                self._teardown_failed(rec, exc)
                if not isinstance(exc, Exception):
                    raise
                return False
            recovery.drop_record(self.config.root, rec.id)
            rec.state = st.OOM_TERMINATED if rec.terminated and rec.final == st.DESTROYED else rec.final
            rec.event("destroyed")
            with self._lock:
                self._envs.pop(rec.id, None)
                self._gone[rec.id] = rec.state
                while len(self._gone) > _TOMBSTONES:
                    self._gone.pop(next(iter(self._gone)))
            if rec.final == st.DESTROYED:
                self.counters.bump("destroyed")
        if rec.fork_layers:
            self._collect_forks()
        return True

    def _collect_forks(self) -> None:
        """Remove the fork layers no live environment stacks any more (rollstack.node.forks)."""
        if self.stages is None:
            return
        with self._lock:
            in_use = [p for r in self._envs.values() for p in r.fork_layers]
        try:
            self.stages.forks.collect(in_use)
        except Exception:  # noqa: BLE001 - a layer left is collected by the next teardown or start
            log.exception("collecting fork layers failed")

    def fork(self, env_id: str, count: int = 1, lease: float | None = None,
             idempotency_key: str | None = None) -> list[CreateResponse]:
        """`count` new environments whose filesystem is `env_id`'s at this instant (the parent
        is paused for the copy of its changes, then runs on unchanged). Children inherit the
        plan (quotas, network policy, env, workdir), not the processes; all or none.
        `idempotency_key`: a retry with it returns the same children (as for `create`)."""
        lease = _check_lease(lease)
        if idempotency_key is None:
            return self._fork(env_id, count, lease)
        group = self._keys.run(idempotency_key, fingerprint({"fork": env_id}, count, lease),
                               lambda: self._fork(env_id, count, lease))
        self.renew([c.id for c in group])  # a retry is a sign of life
        return group

    def _fork(self, env_id: str, count: int, lease: float | None) -> list[CreateResponse]:
        from rollstack.node.fanout import create_group

        parent = self._running(env_id)
        if parent.internal:
            raise InvalidRequest(f"environment {env_id} is an evaluator: it cannot be forked")
        stages = self._stages()
        plan = parent.plan.model_copy(update={"mutation": None, "mutation_text": None})  # in the layer
        made: list[Path] = []

        def source() -> Any:
            prepared = stages.fork_source(parent)
            made.append(prepared.fork_layers[0])
            return prepared

        lowers = stages.lowers
        try:  # the node's background extraction and builds wait for the cut and the binds
            with lowers.hold() if lowers is not None else contextlib.nullcontext():
                group = create_group(self, plan, count, source=source)
        finally:
            for layer in made:
                stages.forks.settle(layer)
            if made:
                self._collect_forks()  # a fork that failed leaves no layer behind
        self.counters.bump("forks")
        if lease is not None:
            self.renew([c.id for c in group], lease)
        return group

    def snapshot(self, env_id: str, name: str) -> Snapshot:
        """Publish the environment's filesystem now as plan `name` (`NAME:TAG`) in the node's
        store; `create(name)` starts from it on any node sharing the store (docs/fork.md)."""
        rec = self._live(self._get(env_id))
        if rec.internal:
            raise InvalidRequest(f"environment {env_id} is an evaluator: it cannot be snapshotted")
        return Snapshot(**self._stages().snapshot(rec, name))

    def set_network(self, env_id: str, network: Any) -> EnvironmentInfo:
        """Replace the environment's egress policy now: `network` as a plan takes it (names
        resolved now). Its plan says so from then on (forks, snapshots, a restarted agent's
        record); the `ROLLSTACK_ENDPOINT_i` variables of its create stay as they were."""
        rec = self._get(env_id)
        if rec.internal:
            raise InvalidRequest(f"environment {env_id} is an evaluator: its network is the node's")
        stages = self._stages()
        plan, spec = stages.network_plan(rec, network)  # validated and resolved before the lock
        if rec.net_spec is None:  # re-adopted after a restart: what to put back if this fails
            rec.net_spec = stages.network_plan(rec, rec.plan.model_dump(mode="json")["network"])[1]
        with rec.lock:
            self._live(rec)
            stages.set_network(rec, spec)
            rec.plan = plan
            rec.event("network_set", network=rec.plan.model_dump(mode="json")["network"])
            recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
        return rec.info(self._quotas(rec))

    def snapshots(self, source: str | None = None) -> list[SnapshotInfo]:
        """The snapshots in the node's store (of environment `source` only, if given)."""
        from rollstack.plan.snapshots import list_snapshots

        return [SnapshotInfo(**s.to_dict()) for s in list_snapshots(self._store(), source)]

    def delete_snapshot(self, name: str) -> None:
        """Remove snapshot `name` (NAME:TAG) from the store; TemplateNotFound if there is none.
        Environments created from it keep running (their layers are in the lazy store)."""
        from rollstack.plan.snapshots import delete_snapshot

        delete_snapshot(self._store(), name)

    def _store(self) -> Any:
        store = self._stages().store
        assert store is not None
        return store

    def _teardown_failed(self, rec: EnvRecord, exc: BaseException) -> None:
        """Keep `rec` destroying and schedule the next attempt (backoff doubling from 1 s)."""
        rec.teardown_failures += 1
        wait = min(self.config.destroy_retry_max, _RETRY_FIRST * 2 ** (rec.teardown_failures - 1))
        rec.teardown_retry_at = time.monotonic() + wait
        rec.event("destroy_failed", error=f"{type(exc).__name__}: {exc}", attempt=rec.teardown_failures,
                  retry_in=round(wait, 3))
        self.counters.bump("destroy_failures")
        log.warning("destroying %s failed (attempt %d), retrying in %.0f s: %s",
                    rec.id, rec.teardown_failures, wait, exc)
        if not rec.internal:  # a restart must finish this destroy, not adopt the environment
            try:
                recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
            except OSError:
                log.exception("keeping the recovery record of %s failed", rec.id)

    # -- queries ------------------------------------------------------------------------------

    def _get(self, env_id: str, destroying: bool = False) -> EnvRecord:
        """The record; one being destroyed only for `destroying` readers (info, stats): for
        everything else it is gone."""
        with self._lock:
            rec = self._envs.get(env_id)
        if rec is not None and rec.state == st.DESTROYING and not destroying:
            raise EnvironmentNotFound(f"environment {env_id!r} was destroyed")
        if rec is None:
            state = self._gone.get(env_id)
            if state == st.OOM_TERMINATED:
                raise OomTerminated(f"environment {env_id} was terminated for lack of memory")
            if state is not None:
                raise EnvironmentNotFound(f"environment {env_id!r} was destroyed")
            raise EnvironmentNotFound(f"no environment {env_id!r}")
        return rec

    @staticmethod
    def _live(rec: EnvRecord) -> EnvRecord:
        """`rec` if it is running or paused, else its state's typed error."""
        if rec.state == st.OOM_TERMINATED:
            raise OomTerminated(f"environment {rec.id} was terminated for lack of memory")
        if rec.state != st.RUNNING:
            raise EnvironmentGone(f"environment {rec.id} is {rec.state}")
        return rec

    def _running(self, env_id: str) -> EnvRecord:
        """The record of a running environment that is not paused, else the typed error."""
        rec = self._live(self._get(env_id))
        if rec.paused:
            raise EnvironmentPaused(f"environment {env_id} is paused: resume it first")
        return rec

    def pause(self, env_id: str, mode: str = "freeze") -> EnvironmentInfo:
        """Freeze the environment's processes (the cgroup freezer), or with `mode="checkpoint"`
        dump them to disk with CRIU and end them (rollstack.run.checkpoint), and give its quotas
        back to admission; files stay readable and writable. Idempotent for the same mode."""
        from rollstack.contract.models import PAUSE_MODES

        if mode not in PAUSE_MODES:
            raise InvalidRequest(f"pause mode must be one of {', '.join(PAUSE_MODES)}, not {mode!r}")
        rec = self._get(env_id)
        stages = self._stages()
        with rec.lock:
            self._live(rec)
            if rec.paused and rec.checkpointed != (mode == "checkpoint"):
                held = "checkpointed" if rec.checkpointed else "frozen"
                raise InvalidRequest(f"environment {env_id} is paused ({held}): resume it before a {mode}")
            if not rec.paused:
                rec.checkpointing = mode == "checkpoint"
                try:
                    done = stages.pause(rec, mode)
                finally:
                    rec.checkpointing = False
                rec.paused, rec.checkpointed = True, mode == "checkpoint"
                rec.event("paused", mode=mode, **done)
                if not rec.internal:
                    recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
        return rec.info(self._quotas(rec))

    def resume(self, env_id: str) -> EnvironmentInfo:
        """Thaw a paused environment once admission takes its quotas back (else
        `insufficient_capacity`, retryable, and it stays paused). Idempotent."""
        rec = self._get(env_id)
        stages = self._stages()
        with rec.lock:
            self._live(rec)
            if rec.paused:
                done = stages.resume(rec)
                rec.paused = rec.checkpointed = False
                rec.event("resumed", **done)
                if not rec.internal:
                    recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
        return rec.info(self._quotas(rec))

    def port_target(self, env_id: str, port: int) -> str:
        """`http://ADDRESS:PORT` of an exposed port (rollstack.node.ports)."""
        from rollstack.node.ports import port_target

        return port_target(self._running(env_id), port)

    def info(self, env_id: str) -> EnvironmentInfo:
        """Also of an environment being destroyed (`destroying` until everything is reclaimed)."""
        rec = self._get(env_id, destroying=True)
        return rec.info(self._quotas(rec))

    def list(self) -> list[EnvironmentInfo]:
        """Every environment clients created, `destroying` ones included (their resources remain
        until their teardown is clean)."""
        with self._lock:
            recs = [r for r in self._envs.values() if not r.internal]
        return [r.info(self._quotas(r)) for r in sorted(recs, key=lambda r: r.started_mono)]

    def renew(self, env_ids: list[str], lease: float | None = None) -> LeaseRenewal:
        """Renew the leases of `env_ids` (to `lease` seconds from now if given, which also gives
        an environment without a lease one; else each its own). Ids not live here are `missing`."""
        lease = _check_lease(lease)
        with self._lock:
            recs = [(i, self._envs.get(i)) for i in env_ids]
        out = LeaseRenewal()
        for env_id, rec in recs:
            if rec is None or rec.internal or rec.state not in st.LIVE_STATES:
                out.missing.append(env_id)
                continue
            changed = lease is not None and lease != rec.lease
            rec.renew(lease)
            if changed:
                with rec.lock:  # a teardown (under this lock) drops the record: never rewrite it after
                    if rec.state in (st.RUNNING, st.OOM_TERMINATED):
                        rec.event("lease_set", seconds=lease)
                        recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
            out.renewed.append(env_id)
        return out

    def _quotas(self, rec: EnvRecord) -> Quotas | None:
        if self.stages is None:
            return None
        return self.stages.quotas(rec.id)

    def stats(self, env_id: str) -> Stats:
        rec = self._get(env_id, destroying=True)
        history, events = self._stages().history(rec.id)
        merged = sorted([*rec.events, *events], key=lambda e: e.get("t", 0.0))
        return Stats(history=history, events=merged, state=rec.state)

    @property
    def max_file_bytes(self) -> int:
        return self.config.max_file_bytes

    def health(self) -> Health:
        from rollstack import __version__

        with self._lock:
            n = sum(1 for r in self._envs.values() if r.state in st.LIVE_STATES)
        status = "stopping" if self._stopping.is_set() else "ok"
        return Health(status=status, environments=n, version=__version__)

    def metrics(self) -> dict[str, float]:
        with self._lock:
            states = [r.state for r in self._envs.values()]
        out = {f"{k}_total": float(v) for k, v in self.counters.snapshot().items()}
        out["environments"] = float(sum(1 for s in states if s in st.LIVE_STATES))
        out["environments_max"] = float(self.config.max_environments)
        with self._lock:
            out["destroys_pending"] = float(len(self._destroys))
            recs = list(self._envs.values())
        out["destroys_failing"] = float(sum(1 for r in recs if r.state == st.DESTROYING and r.teardown_failures))
        out["environments_leased"] = float(sum(1 for r in recs if r.lease is not None and r.state in st.LIVE_STATES))
        if self.stages is not None:
            out.update(self.stages.metrics())
        return out

    # -- exec ---------------------------------------------------------------------------------

    def exec(self, env_id: str, request: ExecRequest) -> ExecResult:
        rec = self._running(env_id)
        self.counters.bump("execs")
        return to_wire(self._exec(rec, request, None))

    def exec_stream(self, env_id: str, request: ExecRequest) -> Iterator[ExecChunk]:
        rec = self._running(env_id)
        self.counters.bump("execs")
        return stream(lambda on_output: self._exec(rec, request, on_output), to_wire, name=f"exec-{env_id}")

    async def exec_async(self, env_id: str, request: ExecRequest, offload: Any) -> ExecResult:
        """`exec` for the API's event loop: an agent exec runs on the loop, without a worker
        thread (`Environment.exec_async`); the rest, and any blocking check, through
        `offload(fn)` (the API's worker threads)."""
        rec = self._running(env_id)
        self.counters.bump("execs")
        stages = self._stages()
        kills = self._exec_begin(rec, stages)
        try:
            result = await stages.exec_async(rec, request, offload)
        except (EnvironmentGone, RuntimeFailure) as e:
            await offload(partial(self._exec_failed, rec, stages, kills, e))
            raise
        finally:
            with self._lock:
                rec.execs -= 1
        if rec.state != st.RUNNING or stages.oom_kills(rec) > kills:  # a cgroupfs read: fine on the loop
            await offload(partial(self._exec_end, rec, stages, kills))  # ending it blocks
        return to_wire(result)

    def _exec(self, rec: EnvRecord, request: ExecRequest, on_output: Any, control: Any = None) -> Any:
        """Run the command; an OOM ending (provisioner or kernel) becomes OomTerminated."""
        stages = self._stages()
        kills = self._exec_begin(rec, stages)
        try:
            result = stages.exec(rec, request, on_output, control)
        except (EnvironmentGone, RuntimeFailure) as e:
            self._exec_failed(rec, stages, kills, e)
            raise
        finally:
            with self._lock:
                rec.execs -= 1
        self._exec_end(rec, stages, kills)
        return result

    def _exec_begin(self, rec: EnvRecord, stages: Stages) -> int:
        """Count the exec in; the kernel's OOM kills so far (compared after it)."""
        kills = stages.oom_kills(rec)
        with self._lock:  # parallel execs in one environment
            rec.execs += 1
        return kills

    def _exec_failed(self, rec: EnvRecord, stages: Stages, kills: int, error: BaseException) -> None:
        """Why an exec that failed failed, when it is ours to say: an OOM ending (runc cannot
        start a process in an environment being ended for lack of memory), or a checkpoint that
        ended the processes after the exec was let in (`environment_paused`, as if it had come a
        moment later). Only while a checkpoint is being taken does it wait (for the pause's lock,
        held until the pause is recorded); a freeze never ends a command, but one whose timeout
        passed while frozen cannot be ended before the resume: `environment_paused` too."""
        self._exec_end(rec, stages, kills)
        if rec.checkpointing and rec.lock.acquire(timeout=PAUSE_SETTLE_S):
            rec.lock.release()
        if rec.state != st.RUNNING or not rec.paused:
            return
        if rec.checkpointed:
            raise EnvironmentPaused(f"environment {rec.id} was checkpointed while the command started: "
                                    "resume it first") from error
        if isinstance(error, RuntimeFailure):
            raise EnvironmentPaused(f"environment {rec.id} was paused while the command ran and its "
                                    "timeout passed: the command ends when the environment resumes; "
                                    "resume it and run it again") from error

    def _exec_end(self, rec: EnvRecord, stages: Stages, kills: int) -> None:
        """An OOM ending during the exec (provisioner or kernel) raises OomTerminated."""
        self._check_kernel_oom(rec, stages, kills)
        self._raise_if_oom(rec)

    def exec_attached(self, env_id: str, request: ExecRequest, on_output: Any, control: Any) -> ExecResult:
        """A blocking exec whose caller holds `control` (`rollstack.run.execpump.ExecControl`):
        stdin written while it runs, signals, its pid. For long-lived processes (the E2B API)."""
        rec = self._running(env_id)
        self.counters.bump("execs")
        return to_wire(self._exec(rec, request, on_output, control))

    def set_timeout(self, env_id: str, seconds: float, on_timeout: str | None = None) -> EnvironmentInfo:
        """From now on the environment lives `seconds` more; then the reaper destroys it, or
        pauses it if `on_timeout` is `pause` (kept until changed). A paused one takes a new
        timeout too (its lifetime runs again once it is resumed)."""
        if not 0 < seconds < 10**9:
            raise InvalidRequest(f"timeout must be a positive number of seconds, not {seconds}")
        if on_timeout not in (None, "destroy", "pause"):
            raise InvalidRequest(f"on_timeout is destroy or pause, not {on_timeout!r}")
        rec = self._live(self._get(env_id))
        rec.timeout = rec.age() + float(seconds)
        if on_timeout is not None:
            rec.on_timeout = on_timeout
        rec.timeout_paused = False  # a new lifetime: its end pauses it again
        rec.event("timeout_set", seconds=float(seconds), on_timeout=rec.on_timeout)
        if not rec.internal:
            recovery.save_record(self.config.root, rec.id, rec.recovery_doc())
        return rec.info(self._quotas(rec))

    def _check_kernel_oom(self, rec: EnvRecord, stages: Stages, kills_before: int) -> None:
        if rec.state == st.RUNNING and stages.oom_kills(rec) > kills_before:
            # The kernel killed a process at the memory cap (cgroup v2 memory.max, or v1 before
            # the provisioner disabled the OOM killer): the environment ran out of memory.
            self._on_terminate(rec.id, {"cause": "kernel_oom_kill"})

    def _raise_if_oom(self, rec: EnvRecord) -> None:
        if rec.state == st.OOM_TERMINATED:
            raise OomTerminated(f"environment {rec.id} was terminated for lack of memory (its exec was killed)")

    def _on_terminate(self, env_id: str, detail: dict[str, Any] | None = None) -> None:
        """Provisioner callback (its thread): `env_id` is out of memory for good; end it.

        The state flips first, so the exec the kill ends reports OomTerminated, not exit 137.
        The environment's pieces stay until it is destroyed (files and diff still readable).
        """
        with self._lock:
            rec = self._envs.get(env_id)
        if rec is None or rec.state not in (st.RUNNING, st.CREATING):
            return
        rec.state = st.OOM_TERMINATED
        rec.event("oom_terminated", **(detail or {}))
        if self.stages is not None:
            try:
                self.stages.kill(rec)
            except Exception:  # noqa: BLE001 - destroy reclaims it anyway
                log.exception("killing OOM-terminated environment %s failed", env_id)

    # -- files and diff -----------------------------------------------------------------------

    def read_file(self, env_id: str, path: str) -> bytes:
        rec = self._get(env_id)
        with rec.lock:
            self._check_files(rec)
            return self._stages().read_file(rec, path)

    def write_file(self, env_id: str, path: str, data: bytes) -> None:
        rec = self._get(env_id)
        with rec.lock:
            self._check_files(rec)
            self._stages().write_file(rec, path, data)

    def diff(self, env_id: str, binary: str = "name") -> str:
        if binary not in ("name", "patch"):
            raise InvalidRequest(f"binary must be 'name' or 'patch', not {binary!r}")
        rec = self._get(env_id)
        with rec.lock:
            self._check_files(rec)
            return self._stages().diff(rec, binary)

    def tree(self, env_id: str, op: str, *args: Any) -> Any:
        """A directory operation (rollstack.run.fsops.TreeRoot) confined to the environment's
        root, or to a volume it mounts where the path is in one."""
        if op not in TREE_OPS - {"set_attrs"}:
            raise InvalidRequest(f"not a directory operation: {op!r}")
        rec = self._get(env_id)
        with rec.lock:
            self._check_files(rec)
            return self._stages().tree(rec, op, *args)

    def has_path(self, env_id: str, path: str) -> bool:
        rec = self._get(env_id)
        with rec.lock:
            self._check_files(rec)
            return self._stages().has_path(rec, path)

    # -- volumes ------------------------------------------------------------------------------

    def _mounting(self, name: str, destroying: bool = True) -> list[EnvRecord]:
        """The records whose environments mount volume `name` (the caller holds `_lock`): every
        record until its teardown ends (its mounts last until then), or without `destroying`
        only those whose processes were not killed yet."""
        return [r for r in self._envs.values() if any(m.name == name for m in r.plan.volumes)
                and (destroying or r.state != st.DESTROYING)]

    def _check_volumes(self, plan: Any) -> None:
        """Under `_lock`, at admission: each volume exists, and no exclusive mount collides."""
        volumes = self._stages().volumes
        for m in plan.volumes:
            volumes.get(m.name)  # VolumeNotFound
            holders = self._mounting(m.name, destroying=False)  # a destroyed one's processes are dead
            if holders and (m.exclusive or any(v.exclusive for r in holders for v in r.plan.volumes
                                               if v.name == m.name)):
                raise VolumeBusy(f"volume {m.name!r} is mounted by {', '.join(sorted(r.id for r in holders))}"
                                 f"{'' if m.exclusive else ' exclusively'}: an exclusive mount is its only one")

    def create_volume(self, name: str) -> VolumeInfo:
        v = self._stages().volumes.create(name)
        return VolumeInfo(name=v.name, created=v.created)

    def volumes(self) -> list[VolumeInfo]:
        listed = self._stages().volumes.list()
        with self._lock:
            return [VolumeInfo(name=v.name, created=v.created, mounted_by=sorted(r.id for r in self._mounting(v.name)))
                    for v in listed]

    def delete_volume(self, name: str) -> None:
        """Environments being destroyed still hold their mounts: their teardowns are waited for
        (VOLUME_DELETE_WAIT at most); a running one makes it `volume_busy` at once."""
        volumes = self._stages().volumes
        deadline = time.monotonic() + VOLUME_DELETE_WAIT
        while True:
            with self._lock:  # no create can admit a mount of it between the check and the rename
                holders = self._mounting(name)
                if not holders:
                    grave = volumes.detach(name)
                    break
                running = [r.id for r in holders if r.state != st.DESTROYING]
            if running or time.monotonic() > deadline:
                ids = ", ".join(sorted(running or [r.id for r in holders]))
                raise VolumeBusy(f"volume {name!r} is mounted by {ids}: destroy those environments first"
                                 if running else f"volume {name!r} is still mounted by {ids}, being destroyed")
            self.wait_destroyed(timeout=max(0.0, deadline - time.monotonic()))
            time.sleep(0.05)  # a failed teardown is retried by the reaper, not by a future
        volumes.remove(grave)

    def read_volume_file(self, name: str, path: str) -> bytes:
        return self._stages().read_volume_file(name, path)

    def write_volume_file(self, name: str, path: str, data: bytes) -> None:
        self._stages().write_volume_file(name, path, data)

    def volume_tree(self, name: str, op: str, *args: Any) -> Any:
        """A directory operation (rollstack.run.fsops.TreeRoot, and `set_attrs`) in volume `name`."""
        if op not in TREE_OPS:
            raise InvalidRequest(f"not a directory operation: {op!r}")
        return getattr(self._stages().volume_root(name), op)(*args)

    @staticmethod
    def exec_control(open_stdin: bool = False) -> Any:
        from rollstack.run.execpump import ExecControl

        return ExecControl(open_stdin=open_stdin)

    def with_root(self, env_id: str, fn: Any) -> Any:
        """`fn(root)` with the environment's merged root dir (a host path: wrap it in a
        `rollstack.run.files.SafeRoot`), not racing destroy. For directory operations."""
        rec = self._get(env_id)
        with rec.lock:
            self._check_files(rec)
            return fn(rec.runtime.files.root)

    @staticmethod
    def _check_files(rec: EnvRecord) -> None:
        # The root stays mounted after an OOM kill, so files and diff still work then.
        if rec.state not in (st.RUNNING, st.OOM_TERMINATED) or rec.runtime is None:
            raise EnvironmentGone(f"environment {rec.id} is {rec.state}")

    # -- evaluate -----------------------------------------------------------------------------

    def evaluate(self, env_id: str) -> Evaluation:
        from rollstack.node.scoring import evaluator_plan, reward_file_path, reward_from

        rec = self._get(env_id)
        if rec.plan.evaluator is None:
            raise PlanInvalid(f"plan {rec.plan.name!r} has no evaluator")
        t0 = time.perf_counter()
        patch = self.diff(env_id, binary="patch")  # binary changes must reach the evaluator too
        t_diff = time.perf_counter()
        ev = rec.plan.evaluator
        created = self._create(evaluator_plan(rec.plan, patch), internal=True)
        t_created = time.perf_counter()
        try:
            request = ExecRequest(argv=ev.argv, timeout=ev.timeout, cwd=rec.plan.evaluator_workdir)
            result = self.exec(created.id, request)
            t_run = time.perf_counter()
            path = reward_file_path(ev, rec.plan.evaluator_workdir)
            data = self._read_reward(created.id, path) if path else None
        finally:
            self.destroy(created.id)
        self.counters.bump("evaluations")
        t_end = time.perf_counter()
        return Evaluation(
            reward=reward_from(ev, result.exit_code, data),
            exit_code=result.exit_code,
            output=result.stdout + result.stderr,
            timed_out=result.timed_out,
            timings={
                "diff": round(t_diff - t0, 6),
                "create": round(t_created - t_diff, 6),
                "run": round(t_run - t_created, 6),
                "destroy": round(t_end - t_run, 6),
                "total": round(t_end - t0, 6),
            },
        )

    def _read_reward(self, env_id: str, path: str) -> bytes | None:
        try:
            return self.read_file(env_id, path)
        except RollstackError:
            return None

    # -- reaper -------------------------------------------------------------------------------

    def _reap_loop(self) -> None:
        """Every `reap_interval`: reap (teardowns may take a while: the lazy store has its own
        watcher, `_watch_loop`, so a dead daemon is replaced within a second regardless); every
        TRIM_INTERVAL, hand the memory the node's threads freed back to the kernel."""
        from rollstack.host.libc import malloc_trim

        trimmed = time.monotonic()
        while not self._stopping.wait(self.config.reap_interval):
            try:
                self.reap_expired()
            except Exception:  # noqa: BLE001 - the reaper must outlive any one bad record
                log.exception("reaping failed; trying again in %.1f s", self.config.reap_interval)
            if time.monotonic() - trimmed >= TRIM_INTERVAL:
                malloc_trim()
                trimmed = time.monotonic()

    def _watch_loop(self) -> None:
        """Every second: restart a dead lazy store daemon (creates that met it wait for this)."""
        while not self._stopping.wait(min(1.0, self.config.reap_interval)):
            self.watch_lazy()

    def watch_lazy(self) -> None:
        stages = self.stages
        if stages is None or self._stopping.is_set():
            return
        try:
            if stages.ensure_lazy():
                with self._lock:
                    live = [r for r in self._envs.values() if r.state in st.LIVE_STATES]
                stages.reattach(live)
                self.counters.bump("lazy_daemon_restarts")
        except Exception:  # noqa: BLE001 - retried on the next tick
            log.exception("restarting the lazy store daemon failed")

    def reap_expired(self) -> list[str]:
        """Destroy every environment past its timeout or whose lease lapsed (returns their ids);
        retry the failed teardowns that are due."""
        now = time.monotonic()
        with self._lock:
            ready = [r for r in self._envs.values() if r.state not in (st.CREATING, st.DESTROYING)]
            due = [r for r in self._envs.values()
                   if r.state == st.DESTROYING and r.teardown_failures and r.teardown_retry_at <= now]
        reaped = []
        for rec in ready:
            expired = rec.deadline <= now
            if expired and rec.on_timeout == "pause" and rec.state == st.RUNNING and not rec.timeout_paused:
                expired = not self._pause_on_timeout(rec)  # paused: it stays (`paused_ttl` more)
            if expired:
                log.info("environment %s expired; destroying", rec.id)
                rec.event("expired", timeout=rec.timeout)
            elif rec.lapsed(now):
                log.info("the lease of environment %s lapsed; destroying", rec.id)
                rec.event("lease_expired", lease=rec.lease)
                self.counters.bump("lease_expired")
            else:
                continue
            self._destroy_quietly(rec.id)
            self.counters.bump("reaped")
            reaped.append(rec.id)
        for rec in due:
            if self._stopping.is_set():
                break
            log.info("retrying the destroy of %s (attempt %d)", rec.id, rec.teardown_failures + 1)
            self._teardown(rec, rec.final or st.DESTROYED)
        return reaped


_PAUSE_TRIES = 5
"""Failed pauses at the end of an `on_timeout: pause` lifetime before it is destroyed instead."""


def _check_lease(lease: float | None) -> float | None:
    if lease is None:
        return None
    if not 0 < float(lease) <= MAX_LEASE:
        raise InvalidRequest(f"a lease is 0 < seconds <= {MAX_LEASE:.0f}, not {lease}")
    return float(lease)
