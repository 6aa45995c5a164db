"""A fork's children on late-bound sandboxes (rollstack.run.lateroot, NodeConfig.fork_warm), on a
real node (runc, overlayfs, lazy store): the pool fills after the node's first fork, children
take its sandboxes and get the parent's state at the cut, isolated as cold ones are; a failed
root switch creates the child cold; checkpoints work on them; nothing is left behind."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

from node_helpers import plan, remember, serve_node, sh as _sh
from rollstack import Client
from rollstack.run import lateroot

pytestmark = pytest.mark.integration
TOKEN = "late-token"
POOL = 3


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("late-root")
    with serve_node(root, corpus, TOKEN, max_environments=12, reap_interval=0.5, fork_warm=POOL,
                    fork_warm_max=POOL + 2) as (service, server):
        assert service.stages.late is not None, "late-bound sandboxes are off: make setup builds rollstack-rootswitch"
        with Client(server.url, token=TOKEN, lease=None) as client:
            yield root, service, client



def _full(service) -> None:
    assert service.stages.late.wait_full(120), service.stages.late.stats()
    assert service.stages.late.ready() == service.stages.late.size >= POOL


@contextmanager
def _family(node, script: str) -> Iterator[tuple[Any, Any, list[Any]]]:
    """(service, a parent that ran `script` and forked once, its children so far): the node's
    first fork starts the pool filling, which is then full. Everything is destroyed after."""
    root, service, client = node
    parent = client.create(plan())
    remember(root, parent.id)
    kids: list[Any] = []
    try:
        _sh(parent, script)
        kids += parent.fork(1)
        _full(service)
        yield service, parent, kids
    finally:
        for k in kids:
            remember(root, k.id)  # their cgroups count in serve_node's final check
            k.destroy()
        parent.destroy()
    service.wait_destroyed(120)


def test_children_take_late_bound_sandboxes(node) -> None:
    with _family(node, "echo cut > state.txt && mkdir -p d && echo x > d/f && chown 1000:1000 d/f") \
            as (service, parent, kids):
        hits = service.metrics()["fork_warm_hits_total"]
        kids += parent.fork(POOL)
        assert [k.created.timings.warm for k in kids[1:]] == [True] * POOL
        assert service.metrics()["fork_warm_hits_total"] == hits + POOL
        _sh(parent, "echo later > later.txt")
        for i, k in enumerate(kids):
            assert _sh(k, "cat state.txt") == "cut\n"
            assert _sh(k, "stat -c %u d/f") == "1000\n"
            assert _sh(k, "test -e later.txt && echo yes || echo no") == "no\n"
            assert _sh(k, "pwd") == "/work/app\n"  # the plan's workdir and env, as a cold child's
            assert _sh(k, "echo $TASK") == _sh(parent, "echo $TASK") != "\n"
            _sh(k, f"echo {i} > mine.txt")
            root_line = next(line for line in _sh(k, "cat /proc/self/mountinfo").splitlines()
                             if line.split()[4] == "/")
            assert " overlay rollstack " in root_line and f"/envs/{k.id}/upper" in root_line
            assert _sh(k, "echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo wrote || echo refused") == "refused\n"
        for i, k in enumerate(kids):
            assert _sh(k, "cat mine.txt") == f"{i}\n"
        assert _sh(parent, "test -e mine.txt && echo yes || echo no") == "no\n"
        assert "b/work/app/state.txt" in kids[-1].diff() and "mine.txt" in kids[-1].diff()
        assert kids[-1].evaluate().reward == parent.evaluate().reward
        kids[-1].pause("checkpoint")  # CRIU dumps and restores a switched container like any
        spec = json.loads((service._get(kids[-1].id).runtime.bundle / "config.json").read_text())
        res = spec["linux"]["resources"]  # what the restore applies: the plan's, not the pool's
        assert (res["cpu"]["quota"], res["memory"]["limit"]) == (50_000, 128 << 20), res
        kids[-1].resume()
        assert _sh(kids[-1], "cat mine.txt") == f"{POOL}\n"


def test_a_failed_switch_creates_the_child_cold(node, monkeypatch: pytest.MonkeyPatch) -> None:
    with _family(node, "echo cut > state.txt") as (service, parent, kids):
        failures = service.metrics()["fork_warm_bind_failures_total"]
        monkeypatch.setattr(lateroot, "rootswitch", lambda: "/bin/false")  # every switch fails
        kids += parent.fork(2)
        assert [k.created.timings.warm for k in kids[1:]] == [False, False]  # created cold
        assert service.metrics()["fork_warm_bind_failures_total"] == failures + 2
        for k in kids:
            assert _sh(k, "cat state.txt") == "cut\n"


def test_switches_failing_in_a_row_open_the_breaker_until_the_cooldown(node, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstack.node import warm

    real = lateroot.rootswitch
    monkeypatch.setattr(warm, "BREAKER_STREAK", 2)
    monkeypatch.setattr(warm, "BREAKER_COOLDOWN", 15.0)  # outlasts the cold forks below on a busy node
    with _family(node, "echo cut > state.txt") as (service, parent, kids):
        trips = service.metrics()["fork_warm_breaker_trips_total"]
        monkeypatch.setattr(lateroot, "rootswitch", lambda: "/bin/false")
        kids += parent.fork(2)  # both binds fail: the breaker opens
        m = service.metrics()
        assert m["fork_warm_breaker_trips_total"] == trips + 1 and m["fork_warm_breaker_open"] == 1
        hits, misses = m["fork_warm_hits_total"], m["fork_warm_misses_total"]
        kids += parent.fork(2)  # open: no sandbox is taken (nor bound, nor failed)
        assert [k.created.timings.warm for k in kids[-2:]] == [False, False]
        m = service.metrics()
        assert (m["fork_warm_hits_total"], m["fork_warm_misses_total"]) == (hits, misses + 2)
        monkeypatch.setattr(lateroot, "rootswitch", real)
        deadline = time.monotonic() + 60
        while service.metrics()["fork_warm_breaker_open"] and time.monotonic() < deadline:
            time.sleep(0.2)  # the cooldown
        _full(service)  # then the refill fills the pool again
        kids += parent.fork(1)
        assert kids[-1].created.timings.warm is True
        for k in kids:
            assert _sh(k, "cat state.txt") == "cut\n"


def test_children_get_the_workdir_even_when_the_parent_removed_it(node) -> None:
    """The workdir check is made once per fork (the children's roots are alike): a parent that
    removed its workdir still gives children that have one."""
    with _family(node, "echo cut > state.txt") as (service, parent, kids):
        _sh(parent, "cd / && rm -rf /work/app")
        kids += parent.fork(2)
        assert [k.created.timings.warm for k in kids[-2:]] == [True, True]
        for k in kids[-2:]:
            assert _sh(k, "pwd && ls -A") == "/work/app\n"  # made empty, as runc makes a cwd


def test_back_to_back_forks_grow_the_pool_by_the_children_they_left_cold(node, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollstack.node import warm

    with _family(node, "echo cut > state.txt") as (service, parent, kids):
        monkeypatch.setattr(warm, "MAX_DEFER", 30.0)  # no refill between the two forks
        monkeypatch.setattr(warm, "LATE_GRACE", 5.0)
        pair = parent.fork(POOL)
        pair += parent.fork(POOL)  # right after: the pool is empty, its children start cold
        assert [bool(k.created.timings.warm) for k in pair] == [True] * POOL + [False] * POOL
        assert service.metrics()["fork_warm_size"] == POOL + 2  # grown by the shortfall, fork_warm_max at most
        for k in pair:  # room for the grown pool (max_environments)
            remember(node[0], k.id)
            k.destroy()
        service.wait_destroyed(120)
        _full(service)  # after LATE_GRACE
        kids += parent.fork(POOL)
        kids += parent.fork(2)
        assert [bool(k.created.timings.warm) for k in kids[-POOL - 2:]] == [True] * (POOL + 2)
        assert all(_sh(k, "cat state.txt") == "cut\n" for k in kids)
        _shrink(service, monkeypatch)


def test_the_pool_grows_to_the_largest_fork(node, monkeypatch: pytest.MonkeyPatch) -> None:
    big = POOL + 2
    with _family(node, "echo cut > state.txt") as (service, parent, kids):
        first = parent.fork(big)  # the pool has POOL: the other two start cold
        assert sum(bool(k.created.timings.warm) for k in first) == POOL
        for k in first:
            k.destroy()
        _full(service)
        assert service.stages.late.ready() == big and service.metrics()["fork_warm_size"] == big
        kids += parent.fork(big)
        assert [bool(k.created.timings.warm) for k in kids[1:]] == [True] * big
        assert all(_sh(k, "cat state.txt") == "cut\n" for k in kids)
        _shrink(service, monkeypatch)


def _shrink(service, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The grown pool back to fork_warm (GROWN_FOR over; the refill looks once a second), so
    that no other test depends on running before or after one that grew it."""
    from rollstack.node import warm

    monkeypatch.setattr(warm, "GROWN_FOR", 0.0)
    end = time.monotonic() + 60
    while service.metrics()["fork_warm_size"] != POOL and time.monotonic() < end:
        time.sleep(0.1)
    assert service.metrics()["fork_warm_size"] == POOL
