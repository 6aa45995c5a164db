"""GRPO fan-out: `count` identical environments of one plan in one call, all or none.

A GRPO group runs N rollouts of the same task side by side. One call admits all N first (so a
group never half-fits the node), then does what the N share once, for all of them:

1. `Stages.prepare`: resolve, the layers' TOCs, the lower dirs;
2. the warm pool's handout of up to N started sandboxes in one step (`WarmPool.take_many`; the
   records take their ids; the rest of the group is created cold);
3. one lazy store request that begins all N environments (`begin_envs`, `POST /v1/envs`: the
   layers are checked and this node's traces read once); for a fork it runs beside the binding
   of the children's late-bound sandboxes (nothing in them reads before they are built; on a
   quiet node this took ~7 ms off a fork of 8, nothing off a fork of 1);
4. the task mutation is planned once (`Group.mutate`: parse the diff and compute every new
   file from the first environment's merged root) and only written into each environment.

Then the N are built in parallel (`START_WORKERS` threads): per environment what is left is
writing the mutation, the workdir and exec defaults (warm), or mount + mutation + `runc run`
(cold), the provisioner's quotas and the record; a fork's children bound on the late pool are
built one after the other (`_build_all`: ~1 ms each, faster than eight threads queueing for the
GIL). If any fails, the ones already built are
destroyed, the rest of the admitted records released, and the first error is raised.

An environment's diff stays relative to the unmutated stack: each environment still has its
own upper with the mutation written into it (a shared, pre-mutated task layer under the uppers
would make the mutation part of the lowers the diff compares against). The plan computed from
one root is valid for all: the N merged views are identical when it is written (same lowers,
fresh empty uppers), and its paths are re-resolved and checked inside each root.

Timings: each environment's `timings` are its own view (the group's resolve and TOC phases,
which it waited for, its own mutation write); `timings.group` has the shared phases once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rollstack.errors import InsufficientCapacity, InvalidRequest
from rollstack.node import record as st
from rollstack.contract.models import CreateResponse, Timings

if TYPE_CHECKING:
    from rollstack.node.service import NodeService
    from rollstack.node.stages import Stages
    from rollstack.plan.mutation import MutationPlan
    from rollstack.run.environment import Environment

log = logging.getLogger(__name__)

MAX_COUNT = 256
"""Most environments one create call may ask for (the lazy store's `begin_envs` limit too)."""
START_WORKERS = 16
"""Environments of one group built at once, shared by concurrent groups. Measured on this
2-core node (docs/benchmarks.md, "GRPO fan-out: shared work"): 2, 4, 8 and 16 builders gave
the same warm group within the noise (the warm path is GIL-bound Python plus kernel time of
the overlay writes), and a cold group of 8 (runc run) was slowest with 2 and 4; so 16."""


@dataclass
class Group:
    """What a group's environments share beyond `Prepared` (read by `Stages.build`)."""

    plan: Any
    warm: dict[str, "Environment"] = field(default_factory=dict)
    """Record id -> the warm sandbox taken for it (popped by the build that uses it)."""
    begun: set[str] = field(default_factory=set)
    """Record ids the lazy store already knows (one `begin_envs` request)."""
    workdir_there: bool = False
    """A fork's late-bound children: the plan's workdir is in their (identical) roots."""
    times: dict[str, float] = field(default_factory=dict)
    _plan: "MutationPlan | None" = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def mutate(self) -> Any:
        """`fn(root)` writing the group's mutation into one environment's root, or None."""
        return self._mutate if self.plan.mutation_text else None

    def _mutate(self, root: Path) -> None:
        from rollstack.plan.mutation import plan_mutation, write_mutation

        with self._lock:  # the first environment plans it from its root; the others wait
            if self._plan is None:
                t = time.perf_counter()
                self._plan = plan_mutation(root, self.plan.mutation_text, workdir=self.plan.workdir)
                self.times["mutation_plan"] = round(time.perf_counter() - t, 6)
            plan = self._plan
        write_mutation(root, plan)


def create_group(service: "NodeService", plan: Any, count: int,
                 source: Callable[[], Any] | None = None) -> list[CreateResponse]:
    """`count` environments of `plan`, all or none. `source`: a fork's shared work instead of
    `Stages.prepare` (the parent's frozen layer on its lowers: `Stages.fork_source`), called
    once all are admitted; a fork's children take late-bound sandboxes (`_take_late`)."""
    if not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise InvalidRequest(f"count must be 1..{MAX_COUNT}, not {count!r}")
    stages = service._stages()
    res = plan.resources
    if stages.provisioner is not None and not stages.provisioner.admit(res.cpu * count,
                                                                         res.memory * count):
        raise InsufficientCapacity(f"not enough node capacity for {count} x ({res.cpu} cores, "
                                   f"{res.memory} bytes)")
    recs = []
    try:
        for _ in range(count):
            recs.append(service._admit(plan, internal=False))  # raises InsufficientCapacity
    except BaseException:
        _release(service, recs)
        raise
    t0 = time.perf_counter()
    shared = Timings()
    group = Group(plan)
    try:
        if source is None:
            prepared = replace(stages.prepare(plan, shared, count=count), group=group)
            _take_warm(stages, service, recs, prepared, group)
        else:
            prepared = replace(source(), group=group)
            group.times.update({f"fork_{k}": v for k, v in prepared.fork.items()})
            _take_late(stages, service, recs, group)
        if source is None:
            _begin_all(stages, recs, prepared, group)
        else:  # the lazy store's round trip runs beside the binds (nothing in a child reads yet)
            begun = _pool().submit(_begin_all, stages, recs, prepared, group)
            try:
                _bind_late(stages, recs, prepared, group)
            except BaseException:
                wait([begun])  # the release below ends what it began
                raise
            begun.result()
    except BaseException:
        _release(service, recs)
        _forked(stages, group)
        raise
    prepare_s = time.perf_counter() - t0
    outcomes = _build_all(service, plan, recs, prepared,
                          serial=source is not None and all(r.id in group.warm for r in recs))
    _forked(stages, group)  # its children are built: the pool may refill now
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        for o in outcomes:
            if isinstance(o, CreateResponse):
                service._destroy_quietly(o.id)
        raise errors[0]
    created: list[CreateResponse] = outcomes  # type: ignore[assignment]
    group.times.update(count=float(count), resolve=shared.resolve, toc=shared.toc,
                       total=round(time.perf_counter() - t0, 6))
    for c in created:  # every environment reports the shared phases it waited for
        c.timings.resolve = shared.resolve
        c.timings.toc = round(shared.toc + group.times["begin"] + c.timings.toc, 6)
        c.timings.total = round(c.timings.total + prepare_s, 6)
        c.timings.group = dict(group.times)
    return created


def _build_all(service: "NodeService", plan: Any, recs: list[Any], prepared: Any,
               serial: bool) -> list[Any]:
    """Each record built (`NodeService._create`): its response, or the exception it raised.
    `serial` when every one is a bound late sandbox (a fork's children on the pool): what is left
    per child is ~1 ms of Python and small cgroup writes, and eight threads doing that at once
    only queue for the GIL (a fork of 8, A/B in one process: 69.7 vs 76.7 ms p50). Otherwise in
    parallel (`START_WORKERS`): a cold child's mounts and `runc run` mostly wait."""
    if serial:
        builds = [partial(service._create, plan, False, rec, prepared) for rec in recs]
    else:
        futures = [_pool().submit(service._create, plan, False, rec, prepared) for rec in recs]
        builds = [f.result for f in futures]
    outcomes: list[Any] = []
    for build in builds:
        try:
            outcomes.append(build())
        except BaseException as exc:  # noqa: BLE001 - collected, the first one re-raised
            outcomes.append(exc)
    return outcomes


def _take_warm(stages: "Stages", service: "NodeService", recs: list[Any], prepared: Any, group: Group) -> None:
    """Up to len(recs) warm sandboxes in one step; each taken one's record takes its id."""
    if stages.warm is None or not _eligible(stages, group.plan):
        return
    t = time.perf_counter()
    envs = stages.warm.take_many([r.digest for r in prepared.refs], prepared.lowers, len(recs),
                                 group.plan.workdir)
    _hand(service, recs, envs, group, t)


def _take_late(stages: "Stages", service: "NodeService", recs: list[Any], group: Group) -> None:
    """Up to len(recs) late-bound sandboxes for a fork's children, each taken one's record
    taking its id (`_bind_late` gives them their roots)."""
    late = stages.late  # read once: a node stop may clear it
    if late is None or not _eligible(stages, group.plan, late=True):
        return
    t = time.perf_counter()
    envs = late.take_late(len(recs))
    group.times["late_take"] = float(len(envs))
    _hand(service, recs, envs, group, t)


def _bind_late(stages: "Stages", recs: list[Any], prepared: Any, group: Group) -> None:
    """The taken late-bound sandboxes' roots bound in one step (`Stages.bind_late`: the mounts,
    then one switch process for all); one that failed is destroyed and its record built cold."""
    taken = {rec.id: rec for rec in recs if rec.id in group.warm}
    if not taken:
        return
    t = time.perf_counter()
    for rid in stages.bind_late(taken, prepared.lowers, prepared.fork_layers, group.mutate):
        del group.warm[rid]
    bound = [group.warm[rid] for rid in taken if rid in group.warm]
    if bound and group.mutate is None:  # one look for all: each handout's walk cost ~0.9 ms
        from rollstack.node.warm import has_dir

        group.workdir_there = has_dir(bound[0], group.plan.workdir)
    group.times["late_bind"] = round(time.perf_counter() - t, 6)


def _forked(stages: "Stages", group: Group) -> None:
    """Tell the late pool a fork that took from it is done (`WarmPool.forked`)."""
    late = stages.late  # read once: a node stop may clear it
    if "late_take" in group.times and late is not None:
        late.forked()


def _eligible(stages: "Stages", plan: Any, late: bool = False) -> bool:
    from rollstack.node.netplan import network_spec
    from rollstack.node.warm import eligible

    return eligible(plan, network_spec(plan, reserved_node_ports=(stages.config.host_port()[1],)), late)


def _hand(service: "NodeService", recs: list[Any], envs: list[Any], group: Group, t: float) -> None:
    """The taken sandboxes go to the first records, which take their ids."""
    for rec, env in zip(recs, envs):
        service.rekey(rec, env.id)
        rec.runtime = env  # a failing build (or release) tears it down with the record
        group.warm[rec.id] = env
    group.times["warm_take"] = round(time.perf_counter() - t, 6)


def _begin_all(stages: "Stages", recs: list[Any], prepared: Any, group: Group) -> None:
    """One lazy store request that begins every environment of the group."""
    from rollstack.fetch.traces import trace_keys

    plan = group.plan
    t = time.perf_counter()
    trace_key, stack_key = trace_keys(prepared.stack.stack_digest, plan)
    ids = [r.id for r in recs]
    stages.lazy_call(lambda lazy: lazy.begin_envs(
        ids, prepared.refs, background=plan.fetch.background and not plan.fetch.eager,
        trace_key=trace_key, fallback_key=stack_key))
    group.begun.update(ids)
    group.times["begin"] = round(time.perf_counter() - t, 6)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The node's group builders, kept between calls (starting threads per group cost more
    than a warm sandbox's handout on a busy node). Shared by concurrent groups."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=START_WORKERS, thread_name_prefix="rollstack-fanout")
        return _POOL


def _release(service: "NodeService", recs: list[Any]) -> None:
    """Undo the admission of records that were never built (and their taken warm sandboxes)."""
    for rec in recs:
        try:
            service._teardown(rec, final=st.FAILED)
        except Exception:  # noqa: BLE001 - nothing was built; the admission error is the one to report
            log.exception("releasing the admission of %s failed", rec.id)
        finally:
            rec.built.set()  # no create will build it: a destroy from elsewhere need not wait
