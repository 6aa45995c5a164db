"""GRPO fan-out: `count` identical environments of one plan in one call, all or none.

A GRPO group runs N rollouts of the same task side by side. One call admits all N first (so a
group never half-fits the node), does the work they share once (`Stages.prepare`: resolve, the
layers' TOCs, the lower dirs), then mounts, mutates and starts the N environments in parallel.
If any of them fails, the ones already built are destroyed and the first error is raised.

Each environment still gets its own overlay upper with the mutation applied (a few ms on the
corpus tasks): stacking one shared, pre-mutated task layer under the uppers was not done,
because an environment's diff must stay relative to the unmutated stack (the evaluator applies
it there) and the diff code compares one upper against the lowers. With the node's warm pool
(rollstack.node.warm) the group's environments are handed out already started; what is left
per environment is the lazy store's `begin_env`, the mutation, the quotas and the record.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rollstack.errors import InsufficientCapacity, InvalidRequest
from rollstack.node import record as st
from rollstack.node.models import CreateResponse, Timings

if TYPE_CHECKING:
    from rollstack.node.service import NodeService

log = logging.getLogger(__name__)

MAX_COUNT = 256
"""Most environments one create call may ask for."""
START_WORKERS = 16
"""Environments of one group mounted and started at once (runc start is CPU-bound)."""


def create_group(service: "NodeService", plan: Any, count: int) -> list[CreateResponse]:
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
    try:
        prepared = stages.prepare(plan, shared)
    except BaseException:
        _release(service, recs)
        raise
    prepare_s = time.perf_counter() - t0
    futures = [_pool().submit(service._create, plan, False, rec, prepared) for rec in recs]
    outcomes = []
    for f in futures:
        try:
            outcomes.append(f.result())
        except BaseException as exc:  # noqa: BLE001 - collected, the first one re-raised
            outcomes.append(exc)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        for o in outcomes:
            if isinstance(o, CreateResponse):
                service._destroy_quietly(o.id)
        raise errors[0]
    created: list[CreateResponse] = outcomes  # type: ignore[assignment]
    for c in created:  # every environment reports the shared phases it used
        c.timings.resolve, c.timings.toc = shared.resolve, round(shared.toc + c.timings.toc, 6)
        c.timings.total = round(c.timings.total + prepare_s, 6)
    return created


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The node's group builders, kept between calls (starting 16 threads per group cost more
    than a warm sandbox's handout on a busy node). Shared by concurrent groups."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=START_WORKERS, thread_name_prefix="rollstack-fanout")
        return _POOL


def _release(service: "NodeService", recs: list[Any]) -> None:
    """Undo the admission of records that were never built."""
    for rec in recs:
        try:
            service._teardown(rec, final=st.FAILED)
        except Exception:  # noqa: BLE001 - nothing was built; the admission error is the one to report
            log.exception("releasing the admission of %s failed", rec.id)
