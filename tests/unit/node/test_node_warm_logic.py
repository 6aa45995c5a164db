"""The warm pool's bookkeeping (rollstack.node.warm.WarmPool) over a stand-in runtime: which
stack is refilled, caps, trading room between stacks, stale lowers, dead sandboxes, trimming.
The real sandboxes are tests/integration/node/test_node_warm.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rollstack.node.warm import WarmPool


class FakeEnv:
    def __init__(self, env_id: str, lowers: list[Path]) -> None:
        self.id, self.lowers, self.alive, self.destroyed = env_id, [str(p) for p in lowers], True, False

    def init_alive(self) -> bool:
        return self.alive

    def destroy(self) -> None:
        self.destroyed = True

    def reserve_meta(self) -> None:
        self.reserved = True


class FakeRuntime:
    def __init__(self) -> None:
        self.made: list[FakeEnv] = []
        self.lock = threading.Lock()

    def create(self, env_id, lowers, params):  # noqa: ANN001 - the runtime's signature
        assert params.env_id == env_id and params.cwd == "/"
        env = FakeEnv(env_id, lowers)
        with self.lock:
            self.made.append(env)
        return env


def _pool(**kw) -> tuple[WarmPool, FakeRuntime]:
    rt = FakeRuntime()
    return WarmPool(rt, **{"size": 2, "max_total": 8, "cpu_share": 1.0, **kw}), rt  # type: ignore[arg-type]


def _ready(pool: WarmPool) -> list[int]:
    with pool._cond:
        return [len(s.ready) for s in pool._pools.values()]


def test_first_take_misses_then_fills_then_hits() -> None:
    pool, rt = _pool()
    try:
        assert pool.take(["a"], [Path("/l/a")]) is None
        assert pool.wait_full(10) and _ready(pool) == [2]
        env = pool.take(["a"], [Path("/l/a")])
        assert env is not None and env.lowers == ["/l/a"]
        assert pool.wait_full(10) and _ready(pool) == [2]
        assert pool.counters["hits"] == 1 and pool.counters["misses"] == 1
        assert pool.counters["started"] == 3
    finally:
        pool.stop()
    assert all(e.destroyed for e in rt.made if e is not env)  # stop destroys what was not taken
    assert not env.destroyed


def test_other_lowers_for_the_same_layers_drop_the_stale_sandboxes() -> None:
    pool, rt = _pool()
    try:
        pool.take(["a"], [Path("/fuse/a")])
        assert pool.wait_full(10)
        stale = list(rt.made)
        assert pool.take(["a"], [Path("/local/a")]) is None
        assert pool.wait_full(10)
        assert all(e.destroyed for e in stale)
        assert pool.take(["a"], [Path("/local/a")]).lowers == ["/local/a"]
    finally:
        pool.stop()


def test_stale_sandboxes_on_fast_lowers_serve_until_fresh_ones_replace_them() -> None:
    """The layer got an EROFS mount, then its local copy: the sandboxes on the mount (`fast`)
    are still handed out, after any fresh one, while the refill replaces them one by one."""
    pool, rt = _pool(size=3, fast=lambda lowers: all(p.startswith("/erofs") for p in lowers))
    try:
        pool.take(["a"], [Path("/erofs/a")])
        assert pool.wait_full(10)
        on_mount = list(rt.made)
        with pool._cond:  # the refill cannot run while the lock is held: no fresh one yet
            got = pool.take(["a"], [Path("/local/a")])
            assert got is on_mount[0] and pool.stats()["warm_stale"] == 2
        assert pool.wait_full(10)
        assert _ready(pool) == [3] and pool.stats()["warm_stale"] == 0
        assert all(e.destroyed for e in on_mount[1:]) and not got.destroyed
        assert pool.take(["a"], [Path("/local/a")]).lowers == ["/local/a"]
        assert pool.counters["discarded"] == 2
    finally:
        pool.stop()


def test_relower_keeps_fast_sandboxes_as_stale_and_drops_the_rest() -> None:
    pool, rt = _pool(size=2, fast=lambda lowers: all(p.startswith("/erofs") for p in lowers))
    try:
        pool.take(["a"], [Path("/fuse/a")])
        pool.take(["b"], [Path("/erofs/b")])
        assert pool.wait_full(10)
        with pool._cond:
            assert pool.relower(lambda digests: (f"/local/{digests[0]}",)) == 2  # a's, on FUSE
            assert pool.stats()["warm_stale"] == 2  # b's, on an EROFS mount
        assert pool.wait_full(10) and _ready(pool) == [2, 2]
        assert all(e.destroyed for e in rt.made if e.lowers != [f"/local/{e.lowers[0][-1]}"])
    finally:
        pool.stop()


def test_at_the_cap_a_stacks_own_stale_sandbox_makes_room() -> None:
    pool, rt = _pool(size=2, max_total=2, fast=lambda lowers: True)
    try:
        pool.take(["a"], [Path("/erofs/a")])
        assert pool.wait_full(10)
        pool.relower(lambda digests: ("/local/a",))
        assert pool.wait_full(10) and _ready(pool) == [2]
        assert [e.lowers for e in rt.made if not e.destroyed] == [["/local/a"], ["/local/a"]]
    finally:
        pool.stop()


def test_a_dead_sandbox_is_discarded_not_handed_out() -> None:
    pool, rt = _pool()
    try:
        pool.take(["a"], [Path("/l")])
        assert pool.wait_full(10)
        rt.made[0].alive = False
        env = pool.take(["a"], [Path("/l")])
        assert env is rt.made[1] and pool.counters["dead"] == 1
        assert pool.wait_full(10) and rt.made[0].destroyed
    finally:
        pool.stop()


def test_at_the_cap_the_latest_stack_takes_room_from_older_ones() -> None:
    pool, rt = _pool(max_total=2)
    try:
        pool.take(["a"], [Path("/a")])
        assert pool.wait_full(10) and _ready(pool) == [2]
        pool.take(["b"], [Path("/b")])
        assert pool.wait_full(10) and _ready(pool) == [0, 2]
        assert pool.counters["discarded"] == 2
    finally:
        pool.stop()


def test_least_recently_used_stacks_beyond_the_limit_are_dropped() -> None:
    pool, rt = _pool(stacks=2)
    try:
        for name in ("a", "b", "c"):
            pool.take([name], [Path(f"/{name}")])
            assert pool.wait_full(10)
        with pool._cond:
            assert list(pool._pools) == [("b",), ("c",)]
        assert all(e.destroyed for e in rt.made if e.lowers == ["/a"])
    finally:
        pool.stop()


def test_a_dropped_stack_takes_its_stale_sandboxes_with_it() -> None:
    pool, rt = _pool(stacks=1, fast=lambda lowers: True)
    try:
        pool.take(["a"], [Path("/erofs/a")])
        assert pool.wait_full(10)
        with pool._cond:  # no refill meanwhile: a's two sandboxes are stale when b pushes a out
            pool.relower(lambda digests: ("/local/a",))
            assert pool.stats()["warm_stale"] == 2
            pool.take(["b"], [Path("/b")])
        assert pool.wait_full(10)
        assert all(e.destroyed for e in rt.made if e.lowers[0].endswith("/a"))
        assert pool.stats()["warm_stale"] == 0 and _ready(pool) == [2]
    finally:
        pool.stop()


def test_no_room_on_the_node_means_no_refill_and_a_trim() -> None:
    room = {"n": 8}
    pool, rt = _pool(room=lambda: room["n"])
    try:
        pool.take(["a"], [Path("/a")])
        assert pool.wait_full(10) and _ready(pool) == [2]
        room["n"] = 1  # live environments grew: one sandbox must go
        with pool._cond:
            pool._cond.notify_all()
        for _ in range(200):
            if _ready(pool) == [1] and sum(e.destroyed for e in rt.made) == 1:
                break
            threading.Event().wait(0.01)
        assert _ready(pool) == [1] and sum(e.destroyed for e in rt.made) == 1
    finally:
        pool.stop()


@pytest.mark.parametrize("kw", [{"size": 0}, {"max_total": 0}, {"stacks": 0}, {"cpu_share": 0},
                                {"cpu_share": 1.5}])
def test_bad_sizes_are_refused(kw) -> None:
    with pytest.raises(ValueError):
        WarmPool(FakeRuntime(), **{"size": 2, **kw})  # type: ignore[arg-type]


def _late_pool() -> WarmPool:
    return WarmPool(FakeRuntime(), size=2, max_total=2, cpu_share=1.0, late=True,  # type: ignore[arg-type]
                    room=lambda: 0)  # never starts one: the bookkeeping alone


def test_the_refill_hold_lasts_until_every_fork_that_took_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstack.node import warm

    monkeypatch.setattr(warm, "MAX_DEFER", 60.0)  # a take holds the refill this long at most
    pool = _late_pool()
    try:
        pool.take_late(2)
        pool.take_late(1)  # a second fork, concurrent with the first
        held = pool._quiet_until
        pool.forked()
        assert pool._quiet_until == held  # the other fork still binds
        pool.forked()
        assert pool._quiet_until < held - 30  # both done: LATE_GRACE from now
        pool.forked()  # an extra one (a failed fork's) never goes below zero
        assert pool._forking == 0
    finally:
        pool.stop()


def test_failed_binds_in_a_row_open_the_breaker_and_a_success_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rollstack.node import warm

    monkeypatch.setattr(warm, "BREAKER_COOLDOWN", 2.0)  # the checks right after a trip take ms
    pool = _late_pool()
    try:
        pool.bound(0, warm.BREAKER_STREAK - 1)
        pool.bound(2, 1)  # a success between: the streak starts over
        pool.bound(0, warm.BREAKER_STREAK - 1)
        assert pool.stats()["fork_warm_breaker_open"] == 0
        pool.bound(0, 1)
        assert pool.stats()["fork_warm_breaker_open"] == 1 and pool.counters["breaker_trips"] == 1
        misses = pool.counters["misses"]
        assert pool.take_late(3) == [] and pool.counters["misses"] == misses + 3
        with pool._cond:
            assert pool._plan() == (None, None)  # no refill while open
        time.sleep(2.2)
        assert pool.stats()["fork_warm_breaker_open"] == 0
        pool.bound(0, 1)  # after the cooldown one more failure opens it again
        assert pool.counters["breaker_trips"] == 2
        time.sleep(2.2)
        pool.bound(1, 0)
        pool.bound(0, 1)  # a success reset the streak: one failure is not enough now
        assert pool.stats()["fork_warm_breaker_open"] == 0
        assert pool.counters["bind_failures"] == 2 * (warm.BREAKER_STREAK - 1) + 4
    finally:
        pool.stop()


def test_a_late_pool_grows_to_the_largest_fork_and_shrinks_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rollstack.node import warm

    starts: list[FakeEnv] = []

    def start(rt, env_id, params):  # noqa: ANN001 - lateroot.start's signature
        env = FakeEnv(env_id, [])
        starts.append(env)
        return env

    monkeypatch.setattr("rollstack.run.lateroot.start", start)
    monkeypatch.setattr(warm, "LATE_GRACE", 0.0)
    monkeypatch.setattr(warm, "MAX_DEFER", 0.0)
    pool = WarmPool(FakeRuntime(), size=2, max_total=6, cpu_share=1.0, late=True, grow_to=6)  # type: ignore[arg-type]
    try:
        assert pool.take_late(1) == [] and pool.wait_full(30)
        assert pool.ready() == 2  # a fork of 1: the base size
        assert len(pool.take_late(4)) == 2  # a fork of 4 takes what there is ...
        pool.forked()
        assert pool.wait_full(30) and pool.ready() == 4  # ... and the pool now keeps 4
        pool.take_late(9)  # larger than grow_to: 6 at most
        pool.forked()
        assert pool.wait_full(30) and pool.ready() == 6 and pool.stats()["fork_warm_size"] == 6
        monkeypatch.setattr(warm, "GROWN_FOR", 0.0)  # no fork that large since: back to 2
        end = time.monotonic() + 30  # the refill loop looks once a second
        while pool.ready() != 2 and time.monotonic() < end:
            time.sleep(0.05)
        assert pool.ready() == 2 and pool.stats()["fork_warm_size"] == 2
        assert pool.wait_full(30) and sum(e.destroyed for e in starts) == 4  # the extra ones destroyed
    finally:
        pool.stop()


def test_a_late_pool_grows_by_the_children_back_to_back_forks_left_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstack.node import warm

    monkeypatch.setattr("rollstack.run.lateroot.start", lambda rt, env_id, params: FakeEnv(env_id, []))
    monkeypatch.setattr(warm, "LATE_GRACE", 0.0)
    pool = WarmPool(FakeRuntime(), size=2, max_total=8, cpu_share=1.0, late=True, grow_to=5)  # type: ignore[arg-type]
    try:
        assert pool.take_late(2) == []  # the node's first fork: the pool was empty, it stays at 2
        pool.forked()
        assert pool.wait_full(30) and pool.stats()["fork_warm_size"] == 2
        monkeypatch.setattr(warm, "MAX_DEFER", 30.0)  # no refill between the next two forks
        assert len(pool.take_late(2)) == 2
        assert pool.take_late(2) == []  # right after: the pool was drained, both children cold
        assert pool.stats()["fork_warm_size"] == 4  # ... so it keeps 2 more ready
        pool.forked()
        pool.forked()
        assert pool.wait_full(30) and pool.ready() == 4
        assert [len(pool.take_late(2)) for _ in range(2)] == [2, 2]  # now both are served
        assert len(pool.take_late(3)) == 0 and pool.stats()["fork_warm_size"] == 5  # grow_to at most
        for _ in range(3):
            pool.forked()
    finally:
        pool.stop()


def test_a_pool_of_stacks_never_grows() -> None:
    pool, _ = _pool(grow_to=8)
    try:
        pool.take_many(["a"], [Path("/l/a")], 5)
        assert pool.size == 2 and pool.wait_full(10) and _ready(pool) == [2]
    finally:
        pool.stop()
