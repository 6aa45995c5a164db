"""The GRPO rollout driver: N tasks x K rollouts against a node, with the error handling an RL
loop needs, then per-group rewards, advantages and the environment-time breakdown.

Error handling, by error code (`rollstack.errors`):
- transient (`registry_unavailable`, `insufficient_capacity`, `node_unavailable`): the failed
  call is retried with exponential backoff and jitter, up to `max_retries` in a row; a failed
  create waits outside its concurrency slot; `insufficient_capacity` also lowers the number of
  rollouts in flight (`AdaptiveLimit`, raised again by successes), and a rollout that cannot get
  an evaluator admitted after `max_retries` gives its environment back and starts over
  (`requeues`), so a node smaller than the concurrency never deadlocks on scoring;
- environment lost (`oom_terminated`, `environment_gone`, `node_lost`: its node died): the rollout is resampled from scratch in
  a fresh environment, up to `max_resamples` times (the sample is never scored half-done);
- the task itself is broken (`plan_invalid`, `group_not_found`, `mutation_failed`,
  `invalid_request`): give up on the whole group at once (its other rollouts are not started);
- `unauthorized`: aborts the run (nothing else would work either);
- anything else fails that rollout only (reward None, left out of the group's statistics).

`run_batch()` is the library entry point; `examples/grpo_rollouts.py` is its command line.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from rollstack.errors import RollstackError
from rollstack.integrations.policies import Policy
from rollstack.integrations.tasks import Planner, SweTask, template_planner

TRANSIENT = frozenset({"registry_unavailable", "insufficient_capacity", "node_unavailable"})
RESAMPLE = frozenset({"oom_terminated", "environment_gone", "node_lost"})
GIVE_UP = frozenset({"plan_invalid", "group_not_found", "mutation_failed", "invalid_request"})
ABORT = frozenset({"unauthorized"})

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 6
    """Retries of one call on a transient error."""
    base_delay: float = 0.5
    max_delay: float = 15.0
    jitter: float = 0.25
    """Fraction of the delay added at random, so retries of many rollouts spread out."""
    max_resamples: int = 2
    """Fresh environments for one rollout after its environment died."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        d = min(self.max_delay, self.base_delay * (2**attempt))
        return d * (1.0 + self.jitter * rng.random())


@dataclass
class RolloutResult:
    instance_id: str
    index: int
    status: str
    """ok | gave_up | failed"""
    reward: float | None = None
    error: str | None = None
    message: str = ""
    retries: dict[str, int] = field(default_factory=dict)
    resamples: int = 0
    requeues: int = 0
    """Times the rollout gave its environment back because no evaluator could be admitted."""
    steps: int = 0
    init_seconds: float = 0.0
    """Wall time of environment creation (successful attempt), as the driver sees it."""
    node_init_seconds: float = 0.0
    """The node's own `timings.total` for that creation."""
    exec_seconds: float = 0.0
    eval_seconds: float = 0.0
    total_seconds: float = 0.0


class _TimedEnv:
    """Proxy that adds up the wall time of `exec` calls (and counts them)."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.exec_seconds = 0.0
        self.execs = 0

    async def exec(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return await self._env.exec(*args, **kwargs)
        finally:
            self.exec_seconds += time.monotonic() - t0
            self.execs += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class AdaptiveLimit:
    """How many rollouts hold an environment at once: at most `maximum`, lowered on capacity
    pressure and raised again by successes (additive both ways).

    Why not a plain semaphore: a rollout needs a second environment while it is scored (the
    evaluator's), so with more rollouts in flight than the node can hold, every live rollout can
    end up waiting to be scored while holding the slots the evaluators need. Lowering the limit
    below what is in use when `insufficient_capacity` shows up stops new rollouts from taking
    the slots that finishing rollouts free, so scoring drains the backlog.
    """

    def __init__(self, maximum: int) -> None:
        self.maximum = max(1, maximum)
        self.limit = self.maximum
        self.in_use = 0
        self._cond = asyncio.Condition()

    async def __aenter__(self) -> "AdaptiveLimit":
        async with self._cond:
            await self._cond.wait_for(lambda: self.in_use < self.limit)
            self.in_use += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self._cond:
            self.in_use -= 1
            self._cond.notify_all()

    def shrink(self) -> None:
        self.limit = max(1, min(self.limit, self.in_use) - 1)

    async def grow(self) -> None:
        async with self._cond:
            if self.limit < self.maximum:
                self.limit += 1
                self._cond.notify_all()


class _Retry(Exception):
    """Leave the slot, wait `delay`, try the rollout again (the environment, if any, is gone)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay


class Driver:
    def __init__(
        self,
        client: Any,
        policy: Policy,
        *,
        concurrency: int = 8,
        retry: RetryPolicy | None = None,
        template: dict[str, Any] | None = None,
        planner: Planner | None = None,
        seed: int = 0,
        sleep: Sleep = asyncio.sleep,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.policy = policy
        self.retry = retry or RetryPolicy()
        self.planner = planner or template_planner(template)
        self.seed = seed
        self.sleep = sleep
        self.log = log or (lambda _msg: None)
        self.limit = AdaptiveLimit(concurrency)
        self.given_up: dict[str, str] = {}
        self._rng = random.Random(seed)
        self._k = 1
        self._groups: dict[str, "asyncio.Future[list[Any]]"] = {}
        """A task whose plan has `setup`: its group, set up once and forked (`create(plan, k)`),
        from which each rollout's first attempt takes its environment."""

    def _note(self, exc: RollstackError, result: RolloutResult) -> None:
        result.retries[exc.code] = result.retries.get(exc.code, 0) + 1
        if exc.code == "insufficient_capacity":
            self.limit.shrink()

    async def _evaluate(self, env: Any, result: RolloutResult) -> Any:
        """Scoring, retried in place (the rollout's environment is still needed). When capacity
        never frees up, the rollout is requeued: its environment goes back and it starts over."""
        attempt = 0
        while True:
            try:
                return await env.evaluate()
            except RollstackError as exc:
                if exc.code not in TRANSIENT:
                    raise
                self._note(exc, result)
                # Over the (lowered) limit, this rollout is one too many for the node: after a
                # second refusal give the environment back rather than wait on the others.
                excess = attempt >= 1 and self.limit.in_use > self.limit.limit
                if attempt >= self.retry.max_retries or excess:
                    if exc.code == "insufficient_capacity" and result.requeues < self.retry.max_retries:
                        result.requeues += 1
                        self.log(f"{result.instance_id}#{result.index}: no capacity to score, requeued")
                        raise _Retry(self.retry.delay(0, self._rng)) from exc
                    raise
                delay = self.retry.delay(attempt, self._rng)
                self.log(f"{result.instance_id}#{result.index}: evaluate: {exc.code}, retry in {delay:.1f}s")
                await self.sleep(delay)
                attempt += 1

    async def _attempt(self, task: SweTask, plan: dict[str, Any], result: RolloutResult, creates: list[int]) -> None:
        t0 = time.monotonic()
        try:
            env = await self._group_env(task, plan, result)
            if env is None:
                env = await self.client.create(plan)
        except RollstackError as exc:
            if exc.code not in TRANSIENT or creates[0] >= self.retry.max_retries:
                raise
            self._note(exc, result)
            delay = self.retry.delay(creates[0], self._rng)
            creates[0] += 1
            self.log(f"{result.instance_id}#{result.index}: create: {exc.code}, retry in {delay:.1f}s")
            raise _Retry(delay) from exc
        creates[0] = 0
        result.init_seconds = time.monotonic() - t0
        created = getattr(env, "created", None)
        result.node_init_seconds = created.timings.total if created is not None else 0.0
        timed = _TimedEnv(env)
        try:
            rng = random.Random(f"{self.seed}:{task.instance_id}:{result.index}:{result.resamples}")
            steps = await self.policy.rollout(timed, task, rng)
            result.steps = len(steps)
            result.exec_seconds = timed.exec_seconds
            t1 = time.monotonic()
            evaluation = await self._evaluate(env, result)
            result.eval_seconds = time.monotonic() - t1
            result.reward = float(evaluation.reward)
        finally:
            try:
                await env.destroy()
            except RollstackError as exc:
                self.log(f"{result.instance_id}#{result.index}: destroy: {exc.code}: {exc}")

    async def _group_env(self, task: SweTask, plan: dict[str, Any], result: RolloutResult) -> Any:
        """This rollout's environment from its task's group when the plan has setup commands
        (the node runs them once and forks the group: docs/fork.md), else None. A failed group
        create leaves every rollout to create its own (and the error to its retry rules)."""
        if not plan.get("setup") or self._k < 2 or result.resamples:
            return None
        group = self._groups.get(task.instance_id)
        if group is None:
            group = self._groups[task.instance_id] = asyncio.ensure_future(self.client.create(plan, self._k))
        try:
            envs = await asyncio.shield(group)
        except RollstackError:
            return None
        return envs.pop() if envs else None

    async def _release_groups(self) -> None:
        """Destroy what no rollout took from its group (rollouts that gave up first)."""
        for group in self._groups.values():
            if group.done() and not group.cancelled() and group.exception() is None:
                for env in group.result():
                    try:
                        await env.destroy()
                    except RollstackError as exc:
                        self.log(f"destroy of an unused group environment: {exc.code}: {exc}")
            elif not group.done():
                group.cancel()
        self._groups.clear()

    async def rollout(self, task: SweTask, plan: dict[str, Any], index: int) -> RolloutResult:
        result = RolloutResult(task.instance_id, index, status="failed")
        t0 = time.monotonic()
        creates = [0]  # transient create failures in a row
        try:
            while True:
                if task.instance_id in self.given_up:
                    result.status, result.error = "gave_up", self.given_up[task.instance_id]
                    return result
                delay = None
                try:
                    async with self.limit:
                        if task.instance_id in self.given_up:
                            continue
                        try:
                            await self._attempt(task, plan, result, creates)
                        except _Retry as retry:
                            delay = retry.delay
                        else:
                            result.status, result.error, result.message = "ok", None, ""
                    if delay is None:
                        await self.limit.grow()
                        return result
                    await self.sleep(delay)  # outside the slot: others may use it meanwhile
                    continue
                except RollstackError as exc:
                    result.error, result.message = exc.code, str(exc)
                    if exc.code in ABORT:
                        raise
                    if exc.code in GIVE_UP:
                        self.given_up.setdefault(task.instance_id, exc.code)
                        self.log(f"{task.instance_id}: giving up on the group: {exc.code}: {exc}")
                        continue
                    if exc.code in RESAMPLE and result.resamples < self.retry.max_resamples:
                        result.resamples += 1
                        result.reward = None
                        self.log(f"{task.instance_id}#{index}: {exc.code}, resampling ({result.resamples})")
                        continue
                    return result
                except Exception as exc:  # a policy bug must not take the whole batch down
                    result.error, result.message = type(exc).__name__, str(exc)
                    self.log(f"{task.instance_id}#{index}: {type(exc).__name__}: {exc}")
                    return result
        finally:
            result.total_seconds = time.monotonic() - t0

    async def run(self, tasks: Sequence[SweTask], k: int) -> list[list[RolloutResult]]:
        """K rollouts of every task, all scheduled at once under the concurrency limit. A task
        whose plan has `setup` commands gets its K environments in one group create: set up
        once, forked K times."""
        self._k = k
        plans: dict[str, dict[str, Any]] = {}
        jobs = []
        for task in tasks:
            try:
                plans[task.instance_id] = self.planner(task)
            except RollstackError as exc:
                self.given_up[task.instance_id] = exc.code
            jobs.extend(self._scheduled(task, plans.get(task.instance_id), i) for i in range(k))
        try:
            flat = await asyncio.gather(*jobs)
        finally:
            await self._release_groups()
        return [list(flat[i * k:(i + 1) * k]) for i in range(len(tasks))]

    async def _scheduled(self, task: SweTask, plan: dict[str, Any] | None, index: int) -> RolloutResult:
        if plan is None:
            return RolloutResult(task.instance_id, index, status="gave_up", error=self.given_up[task.instance_id])
        return await self.rollout(task, plan, index)


def grpo_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO's group-relative advantages: (r - mean) / (std + eps); all 0 when the group agrees."""
    if not rewards:
        return []
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    if std == 0.0:
        return [0.0 for _ in rewards]
    return [(r - mean) / (std + eps) for r in rewards]


def _q(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summarize(groups: list[list[RolloutResult]]) -> dict[str, Any]:
    """The report: per-group rewards/advantages, outcome counts, environment-time breakdown."""
    out_groups = []
    all_ok: list[RolloutResult] = []
    for group in groups:
        ok = [r for r in group if r.status == "ok" and r.reward is not None]
        all_ok += ok
        rewards = [r.reward for r in ok]
        adv = grpo_advantages(rewards)  # type: ignore[arg-type]
        out_groups.append({
            "instance_id": group[0].instance_id if group else "",
            "rewards": rewards,
            "mean": statistics.fmean(rewards) if rewards else None,
            "std": statistics.pstdev(rewards) if len(rewards) > 1 else (0.0 if rewards else None),
            "advantages": [round(a, 4) for a in adv],
            "ok": len(ok),
            "failed": sum(r.status == "failed" for r in group),
            "gave_up": sum(r.status == "gave_up" for r in group),
            "errors": sorted({r.error for r in group if r.error and r.status != "ok"}),
        })
    everything = [r for g in groups for r in g]
    retries: dict[str, int] = {}
    for r in everything:
        for code, n in r.retries.items():
            retries[code] = retries.get(code, 0) + n
    phases = {}
    for phase in ("init", "exec", "eval"):
        vals = [getattr(r, f"{phase}_seconds") for r in all_ok]
        phases[phase] = {"total": round(sum(vals), 3), "mean": round(statistics.fmean(vals), 3) if vals else 0.0,
                         "p50": round(_q(vals, 0.5), 3), "p95": round(_q(vals, 0.95), 3)}
    env_total = sum(p["total"] for p in phases.values()) or 1.0
    for p in phases.values():
        p["share"] = round(p["total"] / env_total, 3)
    node_init = [r.node_init_seconds for r in all_ok]
    return {
        "groups": out_groups,
        "rollouts": {
            "total": len(everything),
            "ok": len(all_ok),
            "failed": sum(r.status == "failed" for r in everything),
            "gave_up": sum(r.status == "gave_up" for r in everything),
            "resampled": sum(r.resamples for r in everything),
            "requeued": sum(r.requeues for r in everything),
            "retries": retries,
            "mean_reward": round(statistics.fmean([r.reward for r in all_ok]), 4) if all_ok else None,  # type: ignore[misc]
        },
        "env_time": phases,
        "node_init_p50": round(_q(node_init, 0.5), 3),
    }


async def run_batch(
    client: Any,
    tasks: Sequence[SweTask],
    k: int,
    policy: Policy,
    **driver_options: Any,
) -> tuple[dict[str, Any], list[list[RolloutResult]]]:
    """Run the batch and summarize it: (report, raw results per group)."""
    driver = Driver(client, policy, **driver_options)
    t0 = time.monotonic()
    groups = await driver.run(tasks, k)
    report = summarize(groups)
    report["wall_seconds"] = round(time.monotonic() - t0, 3)
    return report, groups


def results_json(groups: list[list[RolloutResult]]) -> list[list[dict[str, Any]]]:
    """Every rollout result as a plain dict, grouped as `run_batch` returned them (examples/)."""
    return [[asdict(r) for r in g] for g in groups]
