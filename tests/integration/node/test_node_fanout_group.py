"""A GRPO group's shared work end to end (real store, lazy store, overlayfs, runc, cgroups,
execd, warm pool): warm sandboxes taken in one step, one lazy store request for all, the
mutation planned once; a failure part-way through a group (the mutation, or one environment's
quotas) leaves nothing: no environment, mount, cgroup, record, lazy store environment, nor a
taken warm sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_helpers import leftovers, plan, publish_corpus, remember
from rollstack import errors
from rollstack.node.config import NodeConfig
from rollstack.node.recovery import load_records
from rollstack.node.service import NodeService

pytestmark = pytest.mark.integration
SMALL = {"cpu": 0.1, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"}
BAD_MUTATION = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-not what the file says\n+bug\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("group-corpus")
    return publish_corpus(work / "store", work / "build")


@pytest.fixture
def node(corpus: str, tmp_path: Path):
    root = tmp_path / "root"
    service = NodeService(NodeConfig(root=root, store=corpus, warm_pool=4, warm_pool_max=8,
                                     max_environments=32, lowers={"materialize_after": 0}))
    service.start()
    admit = service._admit

    def remembering(plan_, internal, *args, **kw):  # every id a group admits: its cgroup is checked after
        rec = admit(plan_, internal, *args, **kw)
        remember(root, rec.id)
        return rec

    service._admit = remembering  # type: ignore[method-assign]
    try:
        yield service, root
    finally:
        for i in _ready(service):
            remember(root, i)
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def _ready(service: NodeService) -> list[str]:
    warm = service.stages.warm if service.stages is not None else None
    if warm is None:
        return []
    with warm._cond:
        return [e.id for s in warm._pools.values() for e in s.ready]


def _fill(service: NodeService) -> list[str]:
    if service.stages.lowers.erofs is not None:  # the pool moves onto the layers' EROFS mounts first
        assert service.stages.lowers.erofs.wait_idle(60)
    assert service.stages.warm.wait_full(120), service.stages.warm.stats()
    return _ready(service)


def _nothing_left(service: NodeService, root: Path, ready_before: list[str]) -> None:
    assert service.wait_destroyed(60)
    assert service.list() == [] and service.metrics()["environments"] == 0
    assert service.stages.lazy.stats()["environments"] == 0  # begun together, all ended
    assert load_records(root) == {}
    _fill(service)  # the refill is done: every env dir left is a ready sandbox
    left = leftovers(root)
    assert left["cgroups"] == [], left  # of every id the group used (remembered below)
    assert set(left["envs"]) <= set(_ready(service)), left  # only sandboxes still in the pool
    assert not set(ready_before) & set(left["envs"]), left  # the taken ones were destroyed


def test_a_warm_group_shares_its_work_and_reports_it(node) -> None:
    service, root = node
    p = plan(resources=SMALL)
    service.create(p)  # the stack's first create: cold; its pool starts
    service.destroy(service.list()[0].id)
    _fill(service)
    hits = service.stages.warm.counters["hits"]
    group = service.create_many(p, 6)  # 4 warm (one step) + 2 cold
    for c in group:
        remember(root, c.id)
    assert sorted(c.timings.warm for c in group) == [False, False, True, True, True, True]
    assert service.stages.warm.counters["hits"] == hits + 4
    shared = group[0].timings.group
    assert shared is not None and shared["count"] == 6
    assert {"resolve", "toc", "begin", "warm_take", "mutation_plan", "total"} <= set(shared)
    assert all(c.timings.group == shared for c in group)
    assert all(c.timings.toc >= shared["toc"] + shared["begin"] - 1e-6 for c in group)
    lazy = service.stages.lazy
    assert lazy.stats()["environments"] == 6
    diffs = set()
    for c in group:
        assert lazy.env_stats(c.id)["env_id"] == c.id  # begun, under its final (warm) id
        r = service.exec(c.id, _req("cat hello.txt"))
        assert r.stdout == "bug\n"  # the plan written into each root
        diffs.add(service.diff(c.id))
    assert len(diffs) == 1 and "+bug" in diffs.pop()  # relative to the unmutated stack
    for c in group:
        service.destroy(c.id)
    _nothing_left(service, root, [])


def test_a_mutation_that_fails_fails_the_group_and_leaves_nothing(node) -> None:
    service, root = node
    p = plan(resources=SMALL)
    service.create(p)
    service.destroy(service.list()[0].id)
    before = _fill(service)
    for i in before:
        remember(root, i)  # the taken sandboxes' cgroups must go with the failed group
    bad = plan(resources=SMALL, mutation_text=BAD_MUTATION)
    with pytest.raises(errors.MutationFailed):
        service.create_many(bad, 6)
    _nothing_left(service, root, before)
    assert service.counters.snapshot()["create_failures"] >= 1


def test_one_environment_failing_part_way_destroys_the_others(node, monkeypatch) -> None:
    service, root = node
    p = plan(resources=SMALL)
    service.create(p)
    service.destroy(service.list()[0].id)
    before = _fill(service)
    for i in before:
        remember(root, i)
    prov = service.stages.provisioner
    real, calls = prov.register, []

    def register(env_id, *a, **kw):  # the 4th environment's quotas cannot be applied
        calls.append(env_id)
        remember(root, env_id)
        if len(calls) == 4:
            raise errors.RuntimeFailure(f"injected: cannot apply quotas to {env_id}")
        return real(env_id, *a, **kw)

    monkeypatch.setattr(prov, "register", register)
    with pytest.raises(errors.RuntimeFailure, match="injected"):
        service.create_many(p, 6)
    monkeypatch.setattr(prov, "register", real)
    assert len(calls) >= 4
    _nothing_left(service, root, before)
    ok = service.create_many(p, 2)  # the node still creates groups
    for c in ok:
        remember(root, c.id)
        service.destroy(c.id)
    _nothing_left(service, root, [])


def _req(cmd: str):
    from rollstack.contract.models import ExecRequest

    return ExecRequest(command=cmd)
