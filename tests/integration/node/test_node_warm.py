"""The warm pool (rollstack.node.warm) end to end: real store, lazy store, overlayfs, runc,
cgroups and rollstack-execd.

A handed-out sandbox must be indistinguishable from a cold create (namespaces, capabilities,
seccomp, no_new_privileges, cgroup and its quotas, rlimits, env, cwd, mutation, diff, reward);
the pool refills in the background, skips a sandbox whose PID 1 died, replaces stale sandboxes
when a stack's lower dirs change, trades room between stacks, and leaves nothing behind
(handout, failure paths, stop). Bad input on a warm environment (flood, fork bomb, killed
shim, consumer gone) behaves as on a cold one.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from proc_helpers import kill_exec_shim

from node_helpers import leftovers, plan, publish_corpus, remember
from rollstack import Client, errors
from rollstack.node.api import create_app
from rollstack.node.config import NodeConfig
from rollstack.contract.models import ExecRequest
from rollstack.node import recovery
from rollstack.node.server import BackgroundServer
from rollstack.node.service import NodeService


pytestmark = pytest.mark.integration
SMALL = {"cpu": 0.2, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"}
TOKEN = "warm-token"
PROBE = ("grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Seccomp_filters):' "
         "/proc/self/status; cat /proc/self/cgroup | sort; ls /proc/self/ns; ulimit -n; ulimit -u; "
         "cat /proc/self/oom_score_adj; id; hostname; pwd; env | grep -v -E '^(SHLVL|PWD)=' | sort; "
         "cat hello.txt; ip -o link 2>/dev/null | cut -d: -f2; ls -a /.rollstack /dev")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("warm-corpus")
    return publish_corpus(work / "store", work / "build")


def _service(root: Path, corpus: str, **extra) -> NodeService:
    cfg = {"warm_pool": 2, "max_environments": 16, "lowers": {"materialize_after": 0}, **extra}
    service = NodeService(NodeConfig(root=root, store=corpus, **cfg))
    service.start()
    return service


@pytest.fixture
def node(corpus: str, tmp_path: Path):
    root = tmp_path / "root"
    service = _service(root, corpus)
    try:
        yield service, root
    finally:
        ready = _ready_ids(service)
        for i in ready:
            remember(root, i)
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def _ready_ids(service: NodeService) -> list[str]:
    warm = service.stages.warm if service.stages is not None else None
    if warm is None:
        return []
    with warm._cond:
        return [e.id for s in warm._pools.values() for e in s.ready]


def _fill(service: NodeService) -> None:
    """Until the pool is full on the stack's final lowers (a used layer's EROFS mount replaces
    its FUSE dir a moment after the first create, and the pool moves onto it: lowers/erofs.py)."""
    if service.stages.lowers.erofs is not None:
        assert service.stages.lowers.erofs.wait_idle(60)
    assert service.stages.warm.wait_full(120), service.stages.warm.stats()


def _create(service: NodeService, root: Path, p: dict) -> tuple[str, bool]:
    c = service.create(p)
    remember(root, c.id)
    return c.id, c.timings.warm


def _run(service: NodeService, env_id: str, cmd: str, **kw):
    return service.exec(env_id, ExecRequest(command=cmd, **kw))


def _cgroup_file(env_id: str, controller: str, name: str) -> str:
    return Path(f"/sys/fs/cgroup/{controller}/rollstack/{env_id}/{name}").read_text().strip()


def test_a_handed_out_sandbox_is_the_same_as_a_cold_create(node) -> None:
    service, root = node
    p = plan(resources=SMALL)
    cold, was_warm = _create(service, root, p)  # first of its stack: cold, starts the pool
    assert not was_warm
    _fill(service)
    ready = _ready_ids(service)  # each with its handout's state inodes made (host.atomic)
    records = root / recovery.RECORDS_DIR
    assert {f".{i}.json.tmp" for i in ready} <= {p.name for p in records.iterdir()}
    assert all((root / "envs" / i / ".meta.json.tmp").is_file() for i in ready)
    # the plan's workdir (/work/app) is already in their uppers: the mutation makes no dir inode
    assert all((root / "envs" / i / "upper" / "work" / "app").is_dir() for i in ready)
    warm, was_warm = _create(service, root, p)
    assert was_warm and warm in {i.id for i in service.list()}
    assert service.stages.warm.counters["hits"] == 1
    assert (records / f"{warm}.json").is_file() and not (records / f".{warm}.json.tmp").exists()
    assert not (root / "envs" / warm / ".meta.json.tmp").exists()  # used by set_exec_defaults
    a, b = _run(service, cold, PROBE), _run(service, warm, PROBE)
    assert a.exit_code == b.exit_code == 0, (a, b)
    assert "NoNewPrivs:\t1" in a.stdout and "Seccomp:\t2" in a.stdout
    assert "TASK=app" in a.stdout and "/work/app\n" in a.stdout and "bug\n" in a.stdout
    assert a.stdout.replace(cold, "ID") == b.stdout.replace(warm, "ID")
    for env_id in (cold, warm):  # the plan's start quotas on the cgroup, not the pool's
        q = service.stages.provisioner.quotas(env_id)
        assert q["start_cpu"] == pytest.approx(0.2)  # registered with the plan's start quota
        # what the cgroup has is the provisioner's current quota (it may have grown it already)
        assert int(_cgroup_file(env_id, "cpu", "cpu.cfs_quota_us")) in (20000, round(q["cpu"] * 100000))
        assert int(_cgroup_file(env_id, "memory", "memory.limit_in_bytes")) == 64 << 20
        assert _cgroup_file(env_id, "pids", "pids.max") == "4096"
    # per-exec overrides still win over the plan's defaults
    r = _run(service, warm, "echo $TASK; pwd", env={"TASK": "mine"}, cwd="/tmp")
    assert r.stdout == "mine\n/tmp\n"
    _run(service, cold, "echo fixed > hello.txt")
    _run(service, warm, "echo fixed > hello.txt")
    assert service.diff(cold) == service.diff(warm)
    assert service.evaluate(warm).reward == service.evaluate(cold).reward == 1.0
    for env_id in (cold, warm):
        service.destroy(env_id)
    assert service.wait_destroyed(60)


def test_the_pool_refills_and_a_group_takes_it(node, corpus: str, tmp_path: Path) -> None:
    service, root = node
    p = plan(resources=SMALL)
    _create(service, root, p)
    _fill(service)
    started = service.stages.warm.counters["started"]
    with BackgroundServer(create_app(service, TOKEN)) as server, \
            Client(server.url, token=TOKEN) as client:
        envs = client.create(p, count=3)  # 2 warm + 1 cold, all correct
        for e in envs:
            remember(root, e.id)
        assert sorted(e.created.timings.warm for e in envs) == [False, True, True]
        assert {e.exec("cat hello.txt").stdout for e in envs} == {"bug\n"}
        for e in envs:
            e.destroy()
    _fill(service)  # refilled in the background
    stats = service.stages.warm.stats()
    assert stats["warm_ready"] == 2 and service.stages.warm.counters["started"] >= started + 2
    text = service.metrics()
    assert text["warm_ready"] == 2 and text["warm_hits_total"] >= 2


def test_a_dead_sandbox_is_skipped_and_the_create_still_works(node) -> None:
    service, root = node
    p = plan(resources=SMALL)
    _create(service, root, p)
    _fill(service)
    victims = _ready_ids(service)
    with service.stages.warm._cond:
        ready = [e for st in service.stages.warm._pools.values() for e in st.ready]
    for env in ready:  # PID 1 of every ready sandbox dies while it waits
        os.kill(int((root / "envs" / env.id / "bundle" / "init.pid").read_text()), 9)
    end = time.monotonic() + 10  # a SIGKILLed process still has to run to its exit
    while any(e.init_alive() for e in ready) and time.monotonic() < end:
        time.sleep(0.01)
    env_id, was_warm = _create(service, root, p)
    assert not was_warm and service.stages.warm.counters["dead"] == 2
    assert _run(service, env_id, "cat hello.txt").stdout == "bug\n"
    service.destroy(env_id)
    _fill(service)
    for v in victims:  # the dead ones were destroyed by the refill thread
        remember(root, v)
        assert not (root / "envs" / v).exists()


def test_a_stack_change_replaces_the_pool(node, tmp_path: Path) -> None:
    """Same layers on other lower dirs (what a layer's local copy does) refill the pool there;
    its sandboxes on the EROFS mounts (fast lowers: native metadata) serve creates until the
    refill has replaced them; another stack gets its own pool and, at the cap, takes room from
    the older one."""
    service, root = node
    if service.stages.lowers.erofs is None:
        pytest.skip("this kernel has no file-backed EROFS: the pool never stacks fast lowers")
    p = plan(resources=SMALL)
    _create(service, root, p)
    _fill(service)
    warm = service.stages.warm
    stack = next(iter(warm._pools.values()))
    fuse = [str(service.stages.lazy.layer_dir(d)) for d in reversed(stack.digests)]
    assert not service.stages.fast_lowers(fuse)
    assert service.stages.fast_lowers(stack.lowers), stack.lowers  # the EROFS mounts
    stale = _ready_ids(service)
    moved = []
    for i, lower in enumerate(stack.lowers):  # a copy of each lower: same content, other dirs
        dst = tmp_path / f"lower{i}"
        shutil.copytree(lower, dst, symlinks=True)
        moved.append(dst)
    before = warm.counters["discarded"]
    env = warm.take(stack.digests, moved)
    assert env is not None and env.id in stale and env.init_alive()  # stale, still serving
    warm._destroy(env)  # as if never handed out: with its reserved record tmp
    _fill(service)
    assert warm.counters["discarded"] == before + 1 and warm.stats()["warm_stale"] == 0
    assert all(not (root / "envs" / s).exists() for s in stale)
    for s in stale:
        remember(root, s)
    with warm._cond:
        assert next(iter(warm._pools.values())).lowers == tuple(str(m) for m in moved)
    service.stages.warm.max_total = 2  # at the cap: a new stack trades room with the old one
    other = plan(resources=SMALL, groups=["os/busybox:1", "repo/app:1", "evaluator/app:1"])
    _create(service, root, other)
    _fill(service)
    with warm._cond:
        sizes = [len(s.ready) for s in warm._pools.values()]
    assert sizes == [0, 2], sizes


def test_a_failing_handout_leaves_nothing(node) -> None:
    service, root = node
    p = plan(resources=SMALL)
    _create(service, root, p)
    _fill(service)
    taken = set(_ready_ids(service))
    bad = plan(resources=SMALL, mutation_text="--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-nothere\n+bug\n")
    with pytest.raises(errors.RollstackError):
        service.create(bad)
    gone = taken - set(_ready_ids(service))
    assert len(gone) == 1  # one sandbox was taken and torn down with the failed record
    for g in gone:
        remember(root, g)
        assert not (root / "envs" / g).exists()
    assert len(service.list()) == 1


def test_bad_input_on_a_warm_environment(node) -> None:
    service, root = node
    p = plan(resources=SMALL)
    _create(service, root, p)
    _fill(service)
    env_id, was_warm = _create(service, root, p)
    assert was_warm
    r = _run(service, env_id, "head -c 50000000 /dev/zero; echo done >&2", timeout=60)
    assert r.truncated and r.stderr == "done\n"
    # many children, some double-forked (a real fork bomb under a small pids limit: the run
    # tests, same PID 1): the timeout ends the whole tree
    r = _run(service, env_id, "for i in $(seq 150); do sleep 300 & done; (sleep 301 &); sleep 30",
             timeout=3)
    assert r.timed_out and r.exit_code == 124
    time.sleep(0.3)
    ps = _run(service, env_id, "ps -o args").stdout
    assert "sleep 30" not in ps, ps
    # a shim killed mid-exec: a clear runtime_failure, the environment stays usable
    rec = service._get(env_id)
    init = rec.runtime._init_pid()
    errors_seen: list[BaseException] = []

    def run() -> None:
        try:
            _run(service, env_id, "sleep 300")
        except BaseException as e:  # noqa: BLE001 - inspected below
            errors_seen.append(e)

    th = threading.Thread(target=run)
    th.start()
    kill_exec_shim(init)
    th.join(10)
    assert len(errors_seen) == 1 and isinstance(errors_seen[0], errors.RuntimeFailure), errors_seen
    assert _run(service, env_id, "echo still here").stdout == "still here\n"


def test_cycles_and_stop_leave_nothing(corpus: str, tmp_path: Path) -> None:
    """Create -> exec -> destroy cycles through the pool; then stop destroys the ready ones."""
    root = tmp_path / "root"
    service = _service(root, corpus, warm_pool=3, warm_cpu_share=1.0)
    seen: set[str] = set()
    fds = len(os.listdir("/proc/self/fd"))
    try:
        p = plan(resources=SMALL)
        hits = 0
        for i in range(30):
            if i % 4 == 0:
                _fill(service)
            env_id, was_warm = _create(service, root, p)
            seen.add(env_id)
            hits += was_warm
            assert _run(service, env_id, "cat hello.txt").stdout == "bug\n"
            service.destroy(env_id)
        assert hits >= 20, service.stages.warm.stats()
        assert service.wait_destroyed(60)
        seen |= set(_ready_ids(service))
    finally:
        service.stop()
    for i in seen:
        remember(root, i)
    left = leftovers(root)
    assert not any(left.values()), left
    end = time.monotonic() + 10  # the lazy store's fd-holder exits a moment after its daemon
    while _our_processes(root) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _our_processes(root)
    assert len(os.listdir("/proc/self/fd")) <= fds + 4  # a lazily opened file or two, no leak
    assert re.fullmatch(r"e[0-9a-f]{12}", next(iter(seen)))


def _our_processes(root: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(root).encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_off_by_default_and_not_for_network_plans(corpus: str, tmp_path: Path) -> None:
    from rollstack.node.warm import eligible
    from rollstack.node.netplan import network_spec
    from rollstack.plan.model import load_plan

    assert NodeConfig().warm_pool == 0
    service = NodeService(NodeConfig(root=tmp_path / "off", store=corpus))
    service.start()
    try:
        assert service.stages.warm is None
    finally:
        service.stop()
    plain = load_plan(plan())
    assert eligible(plain, network_spec(plain))
    netted = load_plan(plan(network="outbound"))
    assert not eligible(netted, network_spec(netted))
    from rollstack.run.userns import resolve

    default = resolve(None, "runc")  # the sandboxes' choice: asking for it explicitly fits too
    same, other = (load_plan(plan(security={"userns": choice})) for choice in (default, not default))
    assert eligible(same, network_spec(same))
    assert not eligible(other, network_spec(other))
