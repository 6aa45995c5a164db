"""Warm pool: started sandboxes per layer stack, handed out at create (`NodeConfig.warm_pool`).

Most of a create's CPU is starting the container: `runc run` (~13 ms of CPU on this node) and
`runc init` inside it (~9 ms), against ~1 ms for the overlay mount and ~2 ms for a mutation
(docs/runtime.md, "Warm pool"). So the node keeps, per stack that creates ask for, a few
sandboxes already started: a fresh overlay (empty upper) over the stack's lowers, PID 1
rollstack-execd running with its exec socket, the cgroup made, a loopback-only network
namespace; nothing else runs in them. A create whose plan fits takes one and only:

1. takes its id (the node re-keys the admitted record: `Stages.rekey`), so container, cgroup and
   state dir are named as if it had been created for this record;
2. applies the plan's start quotas to the existing cgroup (the provisioner's `register`, as for
   any create; `runc update` when the node runs without a provisioner);
3. applies the task mutation through the host-side merged view (`<env>/rootfs`, the overlay
   mount the container runs on; never into the upper dir, which the mount owns) and creates the
   plan's workdir there if it is missing (what runc does for a spec's cwd);
4. records the plan's workdir and env as the defaults of every exec (`Environment.
   set_exec_defaults`): PID 1's own env and cwd are generic, each command gets the plan's.

Isolation is the same as a cold create's: the sandbox's spec is `build_spec` with the same
namespaces, capabilities, seccomp profile, no_new_privileges, rlimits, pids limit and devices;
only cwd, env (per exec instead) and the start quotas (set at handout) differ.

Which plans: `runtime: runc`, the node's default user-namespace choice (`eligible`), no network
namespace (`network` none), no volumes; others are created cold. Key: the stack's layer digests; a pool also remembers the lower dirs its
sandboxes stack. When the same digests resolve to other dirs (a layer got its EROFS mount,
`lowers.erofs`, or its local copy, `lowers.materialize`: both tell the pool at once, `relower`), the
pool refills on the new dirs. Its sandboxes on the old dirs are *stale*: if those dirs are all
`fast` (native-speed metadata: EROFS mounts, local copies, never a FUSE tree) they keep serving
creates, after the fresh ones, until the refill has replaced them one by one; otherwise they are
destroyed at once. Measured before this rule (`rollstack bench node --warm 128 --image ...`):
the burst after a layer's local copy landed found all 128 sandboxes stale and went cold,
14-17 environments/s against 34-58 for every other burst. At most `warm_stacks` stacks have a pool
(least recently used dropped first).

Refill: one background thread starts one sandbox at a time, then sleeps so that it is busy at
most `warm_cpu_share` of the time (and never while `room()` says the node has no space for
another container, nor within `REFILL_GRACE` of the last handout unless it has waited
`MAX_DEFER` for that already). A create that finds the pool empty is a cold create and wakes the refill.

Late-bound sandboxes (`NodeConfig.fork_warm`, on by default): a second pool of this class
(`late=True`) keeps sandboxes started on no root at all (rollstack.run.lateroot): they serve
any stack, and a fork's children take them, each getting the overlay of the parent's frozen
changes mounted and switched in at handout (`lateroot.bind`, ~3-8 ms) instead of a `runc run`
(~35-50 ms; 8 at once 3-3.5x one). It fills only after the node's first fork (a node that never
forks holds none), to `fork_warm`, and grows to the largest fork it serves (`fork_warm_max` at
most), and by the children it could not serve when forks come faster than it refills (a fork
of 8 right after another on a pool of 8: 16 kept ready from then on); back to `fork_warm` after
GROWN_FOR without a fork that large or short. A child whose switch fails is created cold.

Accounting: a warm sandbox is a container but not an environment: it is not admitted, holds no
provisioner quota and is not listed. It uses ~1 MiB (execd's RSS, kernel objects) and no CPU
while it waits. The pool never starts one while live environments + warm sandboxes would exceed
`max_environments`, and at most `warm_pool_max` exist in all. Leftover sandboxes of a crashed
agent have no record and are destroyed by recovery like any unrecorded environment.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from rollstack.run.environment import Environment, EnvironmentRuntime

log = logging.getLogger(__name__)

WARM_CPU = 1.0
"""Cores of a sandbox's cgroup until handout (runc init runs under it: a small quota would
throttle the start); idle, it uses none."""
WARM_MEMORY = 128 << 20
"""Memory limit of a sandbox's cgroup until handout."""


REFILL_GRACE = 0.25
"""Seconds after a handout before the refill starts another sandbox: the creates being handed
out (a GRPO group's, a burst's) finish first instead of sharing the node's cores with `runc
run` (docs/benchmarks.md, "GRPO fan-out: shared work")."""
LATE_GRACE = 0.02
"""The same for a late pool, counted from the end of the fork that took (`forked`): a fork
binds all its children within its own call, so nothing is still being handed out once it
returned (0.25 s from the take kept the pool empty between back-to-back forks: 0 of 9
children took a sandbox in `bench fork`'s loop)."""
MAX_DEFER = 1.0
"""Seconds the refill waits for such a quiet moment at most, in a row: handouts closer together
than REFILL_GRACE (back-to-back forks, a steady stream of creates) would otherwise never let it
start one, and every later handout would miss."""
GROWN_FOR = 600.0
"""Seconds a late pool stays grown past `size` (to the largest fork it served, `grow_to` at most)
after the last fork that large; then it gives the extra sandboxes back."""
BREAKER_STREAK = 4
"""Failed binds in a row (no bind succeeding between) after which a late pool stops handing out
and refilling for BREAKER_COOLDOWN: when every switch fails on a node (a broken helper, a kernel
that refuses it), each child would otherwise cost a sandbox start, a failed bind and its cold
start. After the cooldown one more failure opens it again; a success closes it."""
BREAKER_COOLDOWN = 60.0


def new_env_id() -> str:
    """An environment id in the node's format (`NodeService._admit`)."""
    return f"e{uuid.uuid4().hex[:12]}"


@dataclass
class _Stack:
    digests: tuple[str, ...]
    lowers: tuple[str, ...]
    ready: list["Environment"] = field(default_factory=list)
    stale: list["Environment"] = field(default_factory=list)  # on older, still fast lowers
    starting: int = 0
    used: float = field(default_factory=time.monotonic)
    workdir: str | None = None  # the last handout's plan workdir: copied up in new sandboxes
    filled: bool = False  # it held the pool's size once: a take it cannot serve then grows it


LATE = ("late-bound",)
"""The one stack key of a late-bound pool (its sandboxes have no lowers until handout)."""


class WarmPool:
    """Per-stack pools of started sandboxes with one refill thread. `late`: one pool of
    late-bound sandboxes (rollstack.run.lateroot), taken with `take_late`."""

    def __init__(self, runtime: "EnvironmentRuntime", size: int, max_total: int = 64,
                 stacks: int = 4, cpu_share: float = 0.5,
                 room: Callable[[], int] | None = None, records: Path | None = None,
                 fast: Callable[[Sequence[str]], bool] | None = None, late: bool = False,
                 room_lock: "threading.Lock | None" = None, grow_to: int = 0) -> None:
        if size < 1 or max_total < 1 or stacks < 1 or not 0 < cpu_share <= 1:
            raise ValueError("warm pool: size, max_total, stacks >= 1 and 0 < cpu_share <= 1")
        self.late = late
        self.runtime, self.size, self.max_total = runtime, size, max_total
        # a late pool grows to the largest fork it serves, `grow_to` at most (GROWN_FOR)
        self.base, self.grow_to = size, max(size, grow_to) if late else size
        self._grown_at = 0.0  # the last take larger than `base`
        self.stacks, self.cpu_share = stacks, cpu_share
        self.room = room or (lambda: 1 << 30)  # containers the node allows besides live envs
        self.records = records  # the node root whose records a handout saves (node.recovery)
        self.fast = fast or (lambda lowers: False)  # lowers a stale sandbox may still serve on
        # held from a refill's room check to its reservation (`starting`): pools that share it
        # (a node's two) take the room they leave each other one at a time, never both at once
        self.room_lock = room_lock or threading.Lock()
        self._pools: OrderedDict[tuple[str, ...], _Stack] = OrderedDict()
        self._discard: list["Environment"] = []
        self._destroying = 0
        self._cond = threading.Condition()
        self._stopped = False
        self._quiet_until = 0.0  # no sandbox is started before (REFILL_GRACE after a handout)
        self._deferred_since: float | None = None  # the refill has waited for quiet since
        self._fail_streak = 0  # a late pool's failed binds in a row
        self._forking = 0  # forks that took from this late pool and have not said `forked`
        self._open_until = 0.0  # a late pool's breaker: no handout nor refill before
        self.counters = {"hits": 0, "misses": 0, "started": 0, "start_failures": 0,
                         "discarded": 0, "dead": 0,
                         **({"bind_failures": 0, "breaker_trips": 0} if late else {})}
        self._thread = threading.Thread(target=self._loop, name="rollstack-warm", daemon=True)
        self._thread.start()

    # -- handout --------------------------------------------------------------------------------

    def take(self, digests: Sequence[str], lowers: Sequence[Path],
             workdir: str | None = None) -> "Environment | None":
        """A started sandbox on exactly these lowers, or None (the create goes cold). Either way
        the stack's pool is (re)targeted to `size` and the refill woken."""
        got = self.take_many(digests, lowers, 1, workdir)
        return got[0] if got else None

    def take_many(self, digests: Sequence[str], lowers: Sequence[Path], n: int,
                  workdir: str | None = None) -> "list[Environment]":
        """Up to `n` started sandboxes on exactly these lowers in one step (a GRPO group; the
        rest of the group goes cold), under one lock hold."""
        digests, low = tuple(digests), tuple(str(p) for p in lowers)
        with self._cond:
            if self._stopped:
                return []
            self._forking += self.late  # each take of a late pool is answered by one `forked`
            before = self.size
            if n > self.base and self.grow_to > self.base:  # forks this large: keep as many ready
                want = min(n, self.grow_to)
                if want >= self.size:  # as large as the pool is now: it stays this large
                    self.size, self._grown_at = want, time.monotonic()
            if self._open():
                self.counters["misses"] += n
                return []
            stack = self._pools.get(digests)
            if stack is not None and stack.lowers != low:  # same layers, other dirs: stale
                self._retarget(stack, low)
            if stack is None:
                stack = self._pools[digests] = _Stack(digests, low)
                while len(self._pools) > self.stacks:  # least recently used stack goes
                    _, old = self._pools.popitem(last=False)
                    self._discard += old.ready + old.stale
                    self.counters["discarded"] += len(old.ready) + len(old.stale)
            self._pools.move_to_end(digests)
            stack.used = time.monotonic()
            stack.workdir = workdir or stack.workdir
            got: list[Environment] = []
            for source in (stack.ready, stack.stale):  # fresh first, then the stale fast ones
                while source and len(got) < n:
                    cand = source.pop(0)
                    if self.late or cand.init_alive():  # a late one's bind checks its PID 1
                        got.append(cand)
                        continue
                    self._discard.append(cand)  # its PID 1 died while it waited
                    self.counters["dead"] += 1
            self.counters["hits"] += len(got)
            self.counters["misses"] += n - len(got)
            if self.late and n > len(got) and stack.filled:  # forks outran the refill: keep as many
                want = min(before + n - len(got), self.grow_to)  # more ready (not for the
                if want > self.size:  # first fork: the pool fills only after it)
                    self.size = want
                if self.size > self.base:
                    self._grown_at = time.monotonic()
            # a late pool holds still until the forks that took say they are done (`forked`),
            # MAX_DEFER at most
            self._quiet_until = time.monotonic() + (MAX_DEFER if self.late else REFILL_GRACE)
            self._cond.notify_all()
        return got

    def take_late(self, n: int) -> "list[Environment]":
        """Up to `n` started late-bound sandboxes (a late pool's; `lateroot.bind` gives each
        its root)."""
        assert self.late, "take_late on a pool of stacks"
        return self.take_many(LATE, (), n)

    def forked(self) -> None:
        """A fork that took from this late pool has built its children (or failed): once no
        other fork that took is still building, the refill may start after LATE_GRACE (instead
        of sharing the cores with the forks' own binds)."""
        with self._cond:
            self._forking = max(0, self._forking - 1)
            if self._forking:
                return
            self._quiet_until = min(self._quiet_until, time.monotonic() + LATE_GRACE)
            self._cond.notify_all()

    def bound(self, ok: int, failed: int) -> None:
        """A fork bound `ok` of its taken sandboxes and `failed` ones failed (each destroyed, its
        child created cold): counted, and BREAKER_STREAK failures in a row open the breaker."""
        with self._cond:
            self.counters["bind_failures"] += failed
            if ok:
                self._fail_streak = 0
                return
            self._fail_streak += failed
            if self._fail_streak >= BREAKER_STREAK and not self._open():
                self._open_until = time.monotonic() + BREAKER_COOLDOWN
                self._fail_streak = BREAKER_STREAK - 1  # after the cooldown, one more failure reopens it
                self.counters["breaker_trips"] += 1
                log.warning("late-bound sandboxes: %d binds failed in a row; forks' children start cold "
                            "for %.0f s", BREAKER_STREAK, BREAKER_COOLDOWN)

    def _open(self) -> bool:
        return self._open_until > time.monotonic()

    def total(self) -> int:
        """Sandboxes this pool holds or is starting, read without its lock (another pool's
        refill asks while holding its own: no lock order to get wrong; `list` copies the dict's
        values in one step under the GIL)."""
        return sum(len(s.ready) + len(s.stale) + s.starting for s in list(self._pools.values()))

    def ready(self) -> int:
        with self._cond:
            return sum(len(s.ready) for s in self._pools.values())

    def _retarget(self, stack: _Stack, low: tuple[str, ...]) -> int:
        """(under the lock) `stack` now stacks `low`: its ready sandboxes become stale ones,
        kept while their lowers are `fast`, destroyed otherwise. Returns how many were dropped."""
        keep: list[Environment] = []
        drop: list[Environment] = []
        for env in stack.stale + stack.ready:
            (keep if self.fast(env.warm_lowers) else drop).append(env)
        self._discard += drop
        self.counters["discarded"] += len(drop)
        stack.ready, stack.stale, stack.lowers = [], keep, low
        self._cond.notify_all()
        return len(drop)

    def relower(self, lowers_of: "Callable[[tuple[str, ...]], tuple[str, ...]]") -> int:
        """Lower dirs changed under the pools (a layer got its EROFS mount or its local copy):
        each stack whose `lowers_of(digests)` differs refills on the new dirs now, not at the
        next create (`_retarget`: its sandboxes on fast lowers serve until replaced). Returns the
        sandboxes dropped."""
        dropped = 0
        with self._cond:
            stacks = list(self._pools.values())
        for stack in stacks:
            low = lowers_of(stack.digests)
            with self._cond:
                if self._pools.get(stack.digests) is stack and stack.lowers != low:
                    dropped += self._retarget(stack, low)
        return dropped

    def wait_full(self, timeout: float) -> bool:
        """Until the refill has nothing left to do (every stack full, or as full as the caps
        allow, and stale sandboxes destroyed); False on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while not self._stopped:
                busy = self._discard or self._destroying or any(s.starting for s in self._pools.values())
                if not busy and self._plan()[0] is None:
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return False

    def stats(self) -> dict[str, float]:
        """Counters and levels, named `warm_*` (a late pool's `fork_warm_*`)."""
        p = "fork_warm" if self.late else "warm"
        with self._cond:
            out = {f"{p}_{k}_total": float(v) for k, v in self.counters.items()}
            out[f"{p}_ready"] = float(sum(len(s.ready) for s in self._pools.values()))
            if self.late:
                out["fork_warm_breaker_open"] = float(self._open())
                out["fork_warm_size"] = float(self.size)
                return out
            out["warm_stale"] = float(sum(len(s.stale) for s in self._pools.values()))
            out["warm_stacks"] = float(len(self._pools))
            last = next(reversed(self._pools.values()), None)
            out["warm_latest_ready"] = float(len(last.ready) if last is not None else 0)  # MRU stack
        return out

    def stop(self) -> None:
        """Stop refilling and destroy every sandbox not handed out."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=60)
        with self._cond:
            envs = self._discard + [e for s in self._pools.values() for e in s.ready + s.stale]
            self._discard, self._pools = [], OrderedDict()
        for env in envs:
            self._destroy(env)

    # -- refill ---------------------------------------------------------------------------------

    def _total(self) -> int:
        return sum(len(s.ready) + len(s.stale) + s.starting for s in self._pools.values())

    def _trim(self) -> None:
        """Live environments grew into the room warm sandboxes hold: give some back (least
        recently used stacks first)."""
        surplus = self._total() - max(0, self.room())
        for stack in self._pools.values():
            for source in (stack.stale, stack.ready):
                while surplus > 0 and source:
                    self._discard.append(source.pop())
                    self.counters["discarded"] += 1
                    surplus -= 1

    def _shrink(self) -> None:
        """(under the lock) A late pool grown past `base` whose last fork that large was
        GROWN_FOR s ago: back to `base`, the extra ready sandboxes destroyed."""
        if self.size <= self.base or time.monotonic() - self._grown_at < GROWN_FOR:
            return
        self.size = self.base
        for stack in self._pools.values():
            while len(stack.ready) > self.size:
                self._discard.append(stack.ready.pop())
                self.counters["discarded"] += 1

    def _plan(self) -> "tuple[_Stack | None, _Stack | None]":
        """(the stack to start a sandbox for, the stack that gives up a ready one to make room
        or None); (None, None): nothing to do. The most recently used stack below its size goes
        first (stale sandboxes do not count toward it); at the pool's cap, its own stale
        sandbox or else a less recently used stack's ready one makes the room, but never past
        the node's own room. No side effects."""
        want = next((st for st in reversed(self._pools.values())
                     if len(st.ready) + st.starting < self.size), None)
        if want is None or self._open():
            return None, None
        room = self.room()
        if self._total() < min(self.max_total, room):
            return want, None
        if self._total() >= room:
            return None, None
        if want.stale:
            return want, want
        for old in self._pools.values():  # least recently used first
            if old is want:
                break
            if old.ready or old.stale:
                return want, old
        return None, None

    def _next(self) -> "_Stack | None":
        want, victim = self._plan()
        if victim is not None:
            self._discard.append(victim.stale.pop() if victim.stale else victim.ready.pop())
            self.counters["discarded"] += 1
        return want

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._shrink()  # every pass: forks that keep the refill busy do not keep it grown
                while not self._stopped and not self._discard and self._plan()[0] is None:
                    self._trim()
                    self._shrink()
                    if self._discard:
                        break
                    self._cond.wait(1.0)
                if self._stopped:
                    return
                now = time.monotonic()
                quiet = self._quiet_until - now
                if quiet > 0 and not self._discard:  # creates are being handed out: wait,
                    deferred = self._deferred_since = self._deferred_since or now
                    if now - deferred < MAX_DEFER:  # but a steady stream of them does not starve it
                        self._cond.wait(min(quiet, MAX_DEFER - (now - deferred)))
                        continue
                self._deferred_since = None
                with self.room_lock:
                    stack = self._next()  # may move a victim to the discard list: destroyed first
                    if stack is not None:
                        stack.starting += 1
                discard, self._discard = self._discard, []
                self._destroying += len(discard)
            for old in discard:
                self._destroy(old)
            if discard:
                with self._cond:
                    self._destroying -= len(discard)
                    self._cond.notify_all()
            if stack is None:
                continue
            t = time.monotonic()
            env = self._start(stack)
            busy = time.monotonic() - t
            with self._cond:
                stack.starting -= 1
                if env is not None and self._pools.get(stack.digests) is stack \
                        and stack.lowers == env.warm_lowers and not self._stopped:
                    stack.ready.append(env)
                    stack.filled |= len(stack.ready) >= self.size
                    if stack.stale and len(stack.ready) + len(stack.stale) > self.size:
                        self._discard.append(stack.stale.pop())  # replaced by this fresh one
                        self.counters["discarded"] += 1
                elif env is not None:
                    self._discard.append(env)  # the stack went stale while it started
                self._cond.notify_all()
                # bounded CPU share: idle (1 - share) / share of the time just spent starting
                self._cond.wait_for(lambda: self._stopped, busy * (1 - self.cpu_share) / self.cpu_share)

    def _start(self, stack: _Stack) -> "Environment | None":
        from rollstack.run.ocispec import SpecParams

        env_id = new_env_id()
        params = SpecParams(env_id=env_id, cwd="/", cpu=WARM_CPU, memory=WARM_MEMORY)
        try:
            if self.late:
                from rollstack.run import lateroot

                env = lateroot.start(self.runtime, env_id, params)
            else:
                env = self.runtime.create(env_id, [Path(p) for p in stack.lowers], params)
        except Exception:  # noqa: BLE001 - a create that needs it goes cold; logged, counted
            log.exception("starting a warm sandbox on %s failed", stack.lowers)
            with self._cond:
                self.counters["start_failures"] += 1
            time.sleep(1.0)  # a broken stack must not spin
            return None
        env.warm_lowers = stack.lowers
        self._reserve(env, stack.workdir)
        with self._cond:
            self.counters["started"] += 1
        return env

    def _reserve(self, env: "Environment", workdir: str | None) -> None:
        """The inodes a handout would make, made now (an inode costs 0.5-1.3 ms of kernel CPU
        on this node's ext4, reusing one ~0.09 ms): the tmp files of its two state writes
        (host.atomic), and the upper's copies of the directories on the stack's last workdir,
        which the task mutation's first write there would make (`SafeRoot.copy_up_dirs`)."""
        from rollstack.node import recovery

        try:
            env.reserve_meta()
            if self.records is not None:
                recovery.reserve_record(self.records, env.id)
            if workdir and not self.late:  # a late one's root is not there yet
                from rollstack.run.files import SafeRoot

                SafeRoot(env.rootfs).copy_up_dirs(workdir)
        except Exception:  # noqa: BLE001 - only slower: the handout then creates them
            log.warning("reserving the state files of warm sandbox %s failed", env.id, exc_info=True)

    def _destroy(self, env: "Environment") -> None:
        """A sandbox never handed out: gone with its reserved record tmp."""
        from rollstack.node import recovery

        try:
            env.destroy()
        except Exception:  # noqa: BLE001 - the next start's recovery reclaims what is left
            log.exception("destroying warm sandbox %s failed", env.id)
        if self.records is not None:
            recovery.drop_record(self.records, env.id)


def handout(env: "Environment", plan: Any, exec_env: dict[str, str],
            mutate: Callable[[Path], None] | None = None, mutated: bool = False,
            workdir_there: bool = False) -> float:
    """Make a taken sandbox the plan's environment (quotas are the caller's: the provisioner's
    register): mutation through the merged view (`mutate(root)`, a GRPO group's planned once,
    else the plan's applied here; `mutated`: already written, as `lateroot.bind` does), the
    workdir (`workdir_there`: a sibling on the same root found it, `has_dir`), exec defaults.
    Returns the mutation's seconds."""
    from rollstack.errors import UnsafePath
    from rollstack.run.files import SafeRoot
    from rollstack.run.ocispec import SpecParams, build_spec
    from rollstack.run.userns import HOST_BASE

    # the checks a spec built from the plan would have made (cwd absolute, env names/values)
    build_spec(str(env.rootfs), SpecParams(env_id=env.id, cwd=plan.workdir, env=exec_env))
    shifted = bool(env.meta().get("userns"))
    t = time.monotonic()
    if plan.mutation_text and not mutated:
        if mutate is None:
            from rollstack.plan.mutation import apply_mutation

            apply_mutation(env.rootfs, plan.mutation_text, workdir=plan.workdir)
        else:
            mutate(env.rootfs)
        if shifted:  # what the node wrote as host root, as a cold create does
            from rollstack.run import userns

            userns.shift_upper(env.upper, via=env.rootfs)
    mutation = time.monotonic() - t
    try:  # its PID 1 runs on the root, so it is mounted (`env.files` would parse mountinfo)
        if not workdir_there:
            SafeRoot(env.rootfs, HOST_BASE if shifted else 0).makedirs(plan.workdir)
    except UnsafePath:
        pass  # an absolute symlink on the way: the command's chdir resolves it in the sandbox
    if env.meta().get("exec_cwd") != plan.workdir or env.meta().get("exec_env") != exec_env:
        env.set_exec_defaults(plan.workdir, exec_env)  # a late one's bind may have written them
    return mutation


def has_dir(env: "Environment", path: str) -> bool:
    """`path` is a directory in the sandbox's root (mounted), no symlink followed. A fork's
    late-bound children have identical roots until built (the same lowers, fresh uppers, no
    mutation), so one look serves them all (`handout`'s `workdir_there`)."""
    from rollstack.errors import RollstackError
    from rollstack.run.files import SafeRoot

    try:
        return SafeRoot(env.rootfs).stat(path).type == "dir"
    except (RollstackError, OSError):
        return False


def eligible(plan: Any, net: Any, late: bool = False) -> bool:
    """Plans a warm sandbox can serve: runc, the user-namespace choice the sandboxes are started
    with (the node's default; a plan that asks for the same explicitly fits too, the other
    choice goes cold), no volumes (mounts are made at start), and no network unless `late` (a
    late-bound sandbox gets its network after the bind: `Stages._attach_network`)."""
    from rollstack.run import userns

    return plan.runtime == "runc" and plan.security.userns in (None, userns.resolve(None, "runc")) \
        and (late or not net.needs_netns) and not plan.volumes


def attach(service: Any) -> None:
    """Give a started `NodeService` a warm pool when its config asks for one."""
    cfg = service.config
    stages = service.stages
    if (cfg.warm_pool <= 0 and cfg.fork_warm <= 0) or stages is None or stages.runtime is None:
        return
    if not stages.runtime.uses_agent:  # a sandbox's exec defaults work on both paths, but
        log.info("warm pool off: no exec agent")  # catatonit has no agent to keep ready
        return

    def room() -> int:  # containers the node allows besides its live environments
        return cfg.max_environments - service.live_count()

    def room_beside(other: str) -> Callable[[], int]:  # each pool leaves the other's sandboxes their room
        def left() -> int:
            pool = getattr(stages, other)  # read once: stop() may clear it meanwhile
            return room() - (pool.total() if pool is not None else 0)
        return left

    stages.rekey = service.rekey
    room_lock = threading.Lock()  # one reservation at a time across both pools
    if cfg.warm_pool > 0:
        stages.warm = WarmPool(stages.runtime, cfg.warm_pool, max_total=cfg.warm_pool_max,
                               stacks=cfg.warm_stacks, cpu_share=cfg.warm_cpu_share,
                               room=room_beside("late"), records=cfg.root, fast=stages.fast_lowers,
                               room_lock=room_lock)
    if cfg.fork_warm > 0:
        from rollstack.run import lateroot

        if lateroot.available(stages.runtime):
            grow_to = max(cfg.fork_warm, cfg.fork_warm_max)
            stages.late = WarmPool(stages.runtime, cfg.fork_warm, max_total=grow_to, stacks=1,
                                   cpu_share=cfg.warm_cpu_share, room=room_beside("warm"),
                                   records=cfg.root, late=True, room_lock=room_lock, grow_to=grow_to)
        else:
            log.info("late-bound fork sandboxes off: %s not built", lateroot.ROOTSWITCH_NAME)
