"""The node end to end, as root: a real OCI layout store, the lazy store daemon, overlayfs, runc,
cgroups, the HTTP API on a loopback port and the SDK. Everything is torn down even on failure."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from node_helpers import leftovers, plan, remember, serve_node
from rollstack import Client, errors
from rollstack.node.config import NodeConfig
from rollstack.contract.models import ExecRequest
from rollstack.node.service import NodeService

pytestmark = pytest.mark.integration
TOKEN = "integration-token"


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("node-root")
    with serve_node(root, corpus, TOKEN, max_environments=6, reap_interval=0.5) as node:
        yield node


@pytest.fixture
def client(node):
    _service, server = node
    with Client(server.url, token=TOKEN) as c:
        yield c


def _create(client: Client, **overrides):
    env = client.create(plan(**overrides))
    remember(NODE_ROOT[0], env.id)
    return env


NODE_ROOT: list[Path] = [Path("/nonexistent")]


def _destroyed(client: Client, env_id: str) -> None:
    """A destroyed environment is gone, or `destroying` while its background teardown runs
    (never gone while its resources remain); it is gone once that finishes."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            assert client.get(env_id).info().state == "destroying"
        except errors.EnvironmentNotFound:
            return
        time.sleep(0.1)
    pytest.fail(f"{env_id} stayed destroying")


def _all_destroyed(service: NodeService) -> None:
    """Wait until the node lists no environment, `destroying` ones included (a slow machine may
    still be tearing down what earlier tests destroyed asynchronously)."""
    import time

    deadline = time.monotonic() + 120
    while service.list() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not service.list(), [(e.id, e.state) for e in service.list()]
    assert service.wait_destroyed(120)  # evaluators' too (not listed)


@pytest.fixture(autouse=True)
def _node_root(node) -> None:
    NODE_ROOT[0] = node[0].config.root


def test_create_exec_files_diff_destroy(client: Client) -> None:
    with _create(client) as env:
        doc = env.created
        assert doc is not None
        assert set(doc.timings.model_dump()) >= {"resolve", "toc", "mount", "mutation", "start", "total"}
        assert doc.fetch.stack_bytes > 0
        # the mutation was applied at init, in the plan's workdir, with the plan's env
        r = env.exec("cat hello.txt; echo $TASK; pwd")
        assert (r.exit_code, r.stdout) == (0, "bug\napp\n/work/app\n")
        r = env.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], cwd="/tmp", env={"X": "1"})
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
        assert env.exec("cat", stdin=b"from stdin").stdout == "from stdin"
        r = env.exec("sleep 30", timeout=1)
        assert r.timed_out
        chunks = list(env.exec_stream("echo one; echo two >&2; exit 5"))
        assert "".join(c.data or "" for c in chunks if c.type == "stdout") == "one\n"
        assert chunks[-1].type == "result" and chunks[-1].result.exit_code == 5
        env.write_file("/work/app/new.txt", b"\x00\x01binary-ish\n")
        assert env.read_file("/work/app/new.txt") == b"\x00\x01binary-ish\n"
        env.write_file("/work/app/notes.txt", "note\n")
        assert env.exec("cat /work/app/notes.txt").stdout == "note\n"
        patch = env.diff()
        assert "+bug" in patch and "notes.txt" in patch and "new.txt" in patch
        assert [e.id for e in client.list()].count(env.id) == 1
        assert env.info().state == "running"
        stats = env.stats()
        assert stats.state == "running"
    _destroyed(client, env.id)
    env.destroy()  # idempotent


def test_evaluate_scores_in_a_clean_environment(client: Client) -> None:
    with _create(client) as fixed, _create(client) as broken:
        fixed.exec("echo fixed > hello.txt")
        before = fixed.diff()
        score = fixed.evaluate()
        assert (score.reward, score.exit_code) == (1.0, 0) and "PASS" in score.output
        assert fixed.diff() == before and fixed.exec("cat hello.txt").stdout == "fixed\n"
        assert fixed.exec("test -e /eval/check.sh").exit_code == 1  # evaluator files never leak in
        score = broken.evaluate()
        assert (score.reward, score.exit_code) == (0.0, 1)
        ids = {e.id for e in client.list()}
        assert ids == {fixed.id, broken.id}  # the evaluator environments are gone


def test_requests_without_the_token_get_401(node) -> None:
    _service, server = node
    for headers in ({}, {"Authorization": "Bearer nope"}):
        r = httpx.get(server.url + "/v1/environments", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert httpx.get(server.url + "/healthz").status_code == 200
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert metrics.status_code == 200
    for name in ("rollstack_environments ", "rollstack_created_total", "rollstack_agent_rss_bytes", 'rollstack_api_seconds_count{op="health"}'):
        assert name in metrics.text


def test_hostile_paths_are_refused(client: Client) -> None:
    with _create(client) as env:
        with pytest.raises(errors.UnsafePath):
            env.read_file("/../../etc/shadow")
        env.exec("ln -s /etc/shadow /tmp/abs; ln -s ../../../../../../etc/shadow /work/app/rel")
        for path in ("/tmp/abs", "/work/app/rel"):
            with pytest.raises(errors.UnsafePath):
                env.read_file(path)
            with pytest.raises(errors.UnsafePath):
                env.write_file(path, b"pwned")
        with pytest.raises(errors.UnsafePath):
            env.write_file("/work/../../../tmp/escape", b"x")


def test_isolation(client: Client) -> None:
    with _create(client) as a, _create(client) as b:
        assert a.exec("cat /etc/passwd").stdout == "root:x:0:0:root:/root:/bin/sh\n"  # not the host's
        a.exec("sleep 300 &")
        procs_b = b.exec("ps -o pid,args").stdout
        assert "sleep 300" not in procs_b
        links = a.exec("ip -o link").stdout.strip().splitlines()
        assert len(links) == 1 and " lo:" in links[0]


def test_unknown_environment_is_not_found(node) -> None:
    service, _server = node
    with pytest.raises(errors.EnvironmentNotFound):
        service.exec("e000000000000", ExecRequest(command="true"))
    with pytest.raises(errors.EnvironmentNotFound):
        service.read_file("e000000000000", "/etc/passwd")


def test_bad_plans_are_plan_invalid(client: Client) -> None:
    with pytest.raises(errors.PlanInvalid):
        client.create({"name": "x"})
    with pytest.raises(errors.GroupNotFound):
        client.create(plan(groups=["os/nothing-here:1"]))
    with pytest.raises(errors.PlanInvalid):
        client.create(plan(mutation="/etc/shadow", mutation_text=None))


def test_admission_refuses_at_once_when_full(corpus: str, tmp_path: Path) -> None:
    service = NodeService(NodeConfig(root=tmp_path / "small", store=corpus, max_environments=2))
    service.start()
    try:
        a = service.create(plan())
        b = service.create(plan())
        with pytest.raises(errors.InsufficientCapacity):
            service.create(plan())
        service.destroy(a.id)
        c = service.create(plan())  # a slot is free again
        for doc in (b, c):
            service.destroy(doc.id)
    finally:
        service.stop()
    assert not any(leftovers(tmp_path / "small").values())


def _processes_in_cgroups_of(env_ids: list[str]) -> list[str]:
    """`"<pid> <cmdline>"` of live processes in any of these environments' cgroups."""
    from rollstack.host.cgroups import env_cgroup

    wanted = [env_cgroup(i) for i in env_ids]
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cgroups = (d / "cgroup").read_text()
            if any(w in cgroups for w in wanted):
                argv = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{d.name} {argv}")
        except OSError:
            continue
    return found


def test_lifecycle_leaves_nothing_behind(corpus: str, tmp_path: Path) -> None:
    root = tmp_path / "leak"
    service = NodeService(NodeConfig(root=root, store=corpus, max_environments=4))
    service.start()
    ids = []
    try:
        for _ in range(20):
            doc = service.create(plan())
            ids.append(doc.id)
            remember(root, doc.id)
            assert service.exec(doc.id, ExecRequest(command="echo x > /tmp/f; sleep 100 & true")).exit_code == 0
            service.destroy(doc.id)
        assert {e.state for e in service.list()} <= {"destroying"}  # listed until reclaimed
        assert service.wait_destroyed(60)  # destroys finish in the background
        assert service.list() == []
        assert not any(leftovers(root).values()), leftovers(root)
        # only this test's processes: the machine is shared (other `sleep 100`s are not ours)
        assert _processes_in_cgroups_of(ids) == []
        assert not [p for p in (root / "envs").iterdir()]
    finally:
        service.stop()


def _crash(service: NodeService) -> None:
    """What an agent crash leaves: no teardown at all (the lazy store daemon keeps serving)."""
    service._stopping.set()  # ends the reaper
    if service.stages is not None and service.stages.provisioner is not None:
        service.stages.provisioner.stop()  # the provisioner thread would have died with the process
    if service.stages is not None and service.stages.lowers.erofs is not None:
        # its EROFS worker too: let it finish (a crash after the mount leaves the mount), else it
        # mounts under the successor's root after the successor cleared the stale ones
        service.stages.lowers.erofs.wait_idle(60)


def _crashed_node(corpus: str, root: Path, *, kill: tuple[str, ...] = ()) -> str:
    """A node with one environment, crashed; `kill` names what dies with it ("daemon", "holder").
    Returns the environment's id."""
    import os
    import signal
    import time

    from rollstack.lazystore import holder
    from rollstack.node.recovery import daemon_pids

    first = NodeService(NodeConfig(root=root, store=corpus))
    first.start()
    doc = first.create(plan())
    remember(root, doc.id)
    first.write_file(doc.id, "/work/app/state.txt", b"kept\n")
    _crash(first)
    mnt, state = root / "lazy" / "mnt", root / "lazy" / "state"

    def victims() -> list[int]:
        return (daemon_pids(mnt) if "daemon" in kill else []) + (holder.pids(state) if "holder" in kill else [])

    for pid in victims():
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while victims() and time.monotonic() < deadline:
        time.sleep(0.05)
    if kill == ("daemon",):  # the holder sees the daemon's socket close a moment after it exits
        while holder.ping(state) != "orphaned" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.ping(state) == "orphaned"
    return doc.id


def test_restart_readopts_a_crashed_runs_environments(corpus: str, tmp_path: Path) -> None:
    from rollstack.node.recovery import daemon_pids

    root = tmp_path / "adopt"
    env_id = _crashed_node(corpus, root)
    orphans = daemon_pids(root / "lazy" / "mnt")
    assert len(orphans) == 1
    second = NodeService(NodeConfig(root=root, store=corpus))
    second.start()
    try:
        assert [e.id for e in second.list()] == [env_id]
        assert second.exec(env_id, ExecRequest(command="cat state.txt hello.txt")).stdout == "kept\nbug\n"
        assert "state.txt" in second.diff(env_id)
        assert daemon_pids(root / "lazy" / "mnt") == orphans  # the old daemon still serves it
        fresh = second.create(plan())
        remember(root, fresh.id)
        assert second.exec(fresh.id, ExecRequest(command="cat hello.txt")).stdout == "bug\n"
    finally:
        second.stop()
    assert not any(leftovers(root).values()), leftovers(root)
    assert daemon_pids(root / "lazy" / "mnt") == []


def test_an_adopted_daemon_that_dies_is_replaced(corpus: str, tmp_path: Path) -> None:
    """After an agent crash the next agent adopts the daemon it left (not its child); when
    that daemon dies too, a successor must start (none did: `bench chaos` saw the node without
    a lazy store for a minute and creates answering node_unavailable), and a create waits for it."""
    import os
    import signal
    import time

    from rollstack.node.recovery import daemon_pids

    root = tmp_path / "adp"
    env_id = _crashed_node(corpus, root)
    second = NodeService(NodeConfig(root=root, store=corpus))
    second.start()
    try:
        assert getattr(second.stages.lazy, "process", None) is None  # adopted, not our child
        (old,) = daemon_pids(root / "lazy" / "mnt")
        os.kill(old, signal.SIGKILL)
        fresh = second.create(plan())  # waits for the successor instead of node_unavailable
        remember(root, fresh.id)
        assert second.exec(fresh.id, ExecRequest(command="cat hello.txt", timeout=60)).stdout == "bug\n"
        deadline = time.monotonic() + 30
        while second.counters["lazy_daemon_restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert second.counters["lazy_daemon_restarts"] == 1
        assert daemon_pids(root / "lazy" / "mnt") not in ([], [old])
        assert second.exec(env_id, ExecRequest(command="cat state.txt", timeout=60)).stdout == "kept\n"
    finally:
        second.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def test_dead_lazy_daemon_is_replaced_under_running_environments(corpus: str, tmp_path: Path) -> None:
    import os
    import signal
    import time

    from rollstack.node.recovery import daemon_pids

    root = tmp_path / "watchdog"
    node = NodeService(NodeConfig(root=root, store=corpus))
    node.start()
    try:
        doc = node.create(plan())
        (old,) = daemon_pids(root / "lazy" / "mnt")
        os.kill(old, signal.SIGKILL)
        # the environment's next command needs the daemon (drop the kernel's caches); it waits for
        # the successor the node starts within about a second, instead of failing
        Path("/proc/sys/vm/drop_caches").write_text("3")
        r = node.exec(doc.id, ExecRequest(command="cat hello.txt && ls /bin | wc -l", timeout=60))
        assert r.exit_code == 0 and r.stdout.startswith("bug\n") and int(r.stdout.split()[-1]) > 10, r
        deadline = time.monotonic() + 10
        while node.counters["lazy_daemon_restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node.counters["lazy_daemon_restarts"] == 1
        assert "fetched_bytes" in node.stages.lazy.env_stats(doc.id)  # re-registered with the successor
        assert daemon_pids(root / "lazy" / "mnt") not in ([], [old])
        fresh = node.create(plan())
        assert node.exec(fresh.id, ExecRequest(command="cat hello.txt")).stdout == "bug\n"
    finally:
        node.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def test_create_waits_for_a_dead_daemons_successor(corpus: str, tmp_path: Path) -> None:
    """The daemon dies between creates: the next create's lazy store call fails on the dead
    daemon, waits for the successor the node starts, and goes on (it used to answer
    node_unavailable, which E2B clients do not retry). The restart is held until the create
    has failed once, so the test takes that path every time."""
    import os
    import signal
    import threading

    root = tmp_path / "cmr"
    node = NodeService(NodeConfig(root=root, store=corpus))
    node.start()
    failed_once = threading.Event()
    watch, await_successor = node.watch_lazy, node.stages._await_successor

    def held_watch() -> None:
        failed_once.wait(30)
        watch()

    def noting_await(dead):
        failed_once.set()
        return await_successor(dead)

    try:
        node.create(plan())  # layers known, caches warm: the next create needs only the daemon
        node.watch_lazy = held_watch  # type: ignore[method-assign]
        node.stages._await_successor = noting_await  # type: ignore[method-assign]
        proc = node.stages.lazy.process
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        doc = node.create(plan())
        assert failed_once.is_set() and node.counters["lazy_daemon_restarts"] == 1
        assert node.exec(doc.id, ExecRequest(command="cat hello.txt", timeout=60)).stdout == "bug\n"
    finally:
        node.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def test_restart_adopts_through_the_fd_holder_after_the_daemon_died(corpus: str, tmp_path: Path) -> None:
    from rollstack.lazystore import holder
    from rollstack.node.recovery import daemon_pids

    root = tmp_path / "crash-held"
    env_id = _crashed_node(corpus, root, kill=("daemon",))  # its fd-holder lives on
    second = NodeService(NodeConfig(root=root, store=corpus))
    second.start()
    try:
        assert [e.id for e in second.list()] == [env_id]  # its lowers work again: adopted
        r = second.exec(env_id, ExecRequest(command="cat state.txt hello.txt && ls /bin | wc -l"))
        assert r.stdout.startswith("kept\nbug\n") and int(r.stdout.split()[-1]) > 10
        fresh = second.create(plan())
        remember(root, fresh.id)
        assert second.exec(fresh.id, ExecRequest(command="cat hello.txt")).stdout == "bug\n"
    finally:
        second.stop()
    assert not any(leftovers(root).values()), leftovers(root)
    assert daemon_pids(root / "lazy" / "mnt") == [] and holder.pids(root / "lazy" / "state") == []


def test_restart_cleans_up_what_it_cannot_adopt(corpus: str, tmp_path: Path) -> None:
    root = tmp_path / "crash"
    env_id = _crashed_node(corpus, root, kill=("daemon", "holder"))  # the lowers are gone
    assert leftovers(root)["envs"] == [env_id]
    second = NodeService(NodeConfig(root=root, store=corpus))
    second.start()
    try:
        assert second.list() == []
        assert not any(leftovers(root).values()), leftovers(root)
        assert second.stages is not None and env_id in second.stages.recovered.envs
        fresh = second.create(plan())
        remember(root, fresh.id)
        assert second.exec(fresh.id, ExecRequest(command="cat hello.txt")).stdout == "bug\n"
    finally:
        second.stop()
    assert not any(leftovers(root).values()), leftovers(root)



def test_restart_after_crash_mid_destroy(corpus: str, tmp_path: Path) -> None:
    """The agent died while it tore an environment down (its state file already removed, its
    dir, mounts and recovery record still there): the next start must not fail on it (it did:
    `environment_gone` out of recovery, seen by `bench chaos` after an agent SIGKILL) but
    clean it up and serve."""
    root = tmp_path / "cmd"
    env_id = _crashed_node(corpus, root)
    (root / "envs" / env_id / "meta.json").unlink()  # the first thing a destroy's rmtree took
    second = NodeService(NodeConfig(root=root, store=corpus))
    second.start()
    try:
        assert second.list() == []
        fresh = second.create(plan())
        remember(root, fresh.id)
        assert second.exec(fresh.id, ExecRequest(command="cat hello.txt")).stdout == "bug\n"
    finally:
        second.stop()
    assert not any(leftovers(root).values()), leftovers(root)

def test_memory_hog_is_oom_terminated_and_neighbours_live(client: Client) -> None:
    small = {"cpu": 0.5, "memory": "32Mi", "max_cpu": 1, "max_memory": "64Mi"}
    with _create(client, resources=small) as hog, _create(client) as neighbour:
        try:
            # user-space writes (string doubling): page faults the memory cgroup must answer
            r = hog.exec('a=xxxxxxxxxxxxxxxx; while :; do a="$a$a"; done', timeout=120)
        except errors.OomTerminated:
            pass
        else:
            pytest.fail(f"the hog was not oom_terminated: {r!r}; stats {hog.stats()!r}")
        assert hog.info().state == "oom_terminated"
        assert any(e.get("type") == "oom_terminated" for e in hog.stats().events)
        with pytest.raises(errors.OomTerminated):
            hog.exec("true")
        assert neighbour.exec("echo alive").stdout == "alive\n"


def test_expired_environments_are_reaped(client: Client) -> None:
    import time

    env = _create(client, timeout=1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            env.info()
        except errors.EnvironmentNotFound:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the reaper did not destroy an expired environment")
    env.destroy()  # already gone: still fine


def test_async_client_against_the_node(node) -> None:
    import anyio

    from rollstack import AsyncClient

    _service, server = node

    async def main() -> None:
        async with AsyncClient(server.url, token=TOKEN) as client:
            async with await client.create(plan()) as env:
                remember(NODE_ROOT[0], env.id)
                assert (await env.exec("cat hello.txt")).stdout == "bug\n"
                chunks = [c async for c in env.exec_stream(["sh", "-c", "echo a; echo b"])]
                assert "".join(c.data or "" for c in chunks if c.type == "stdout") == "a\nb\n"
                await env.write_file("/tmp/x", b"1")
                assert await env.read_file("/tmp/x") == b"1"
            try:  # destroyed: gone, or listed as destroying while its teardown runs
                assert (await (await client.get(env.id)).info()).state == "destroying"
            except errors.EnvironmentNotFound:
                pass

    anyio.run(main)


def test_in_process_node(corpus: str, tmp_path: Path) -> None:
    from rollstack import Node

    root = tmp_path / "local"
    with Node(store=corpus, root=root) as local:
        with local.create(plan()) as env:
            remember(root, env.id)
            assert env.exec("cat hello.txt").stdout == "bug\n"
            env.exec("echo fixed > hello.txt")
            assert env.evaluate().reward == 1.0
        kept = local.create(plan())  # left alive: close() must destroy it
        remember(root, kept.id)
    assert not any(leftovers(root).values()), leftovers(root)


def test_fork_bomb_is_contained(node, client: Client) -> None:
    import time

    _service, server = node
    capped = {"cpu": 0.25, "memory": "128Mi", "max_cpu": 0.25, "max_memory": "128Mi"}
    with _create(client, resources=capped) as bomb, _create(client) as neighbour:
        try:
            bomb.exec("f() { f | f & }; f", timeout=10)  # returns; the bomb keeps going inside
            time.sleep(2)
            tasks = bomb.exec("ls /proc | grep -c '^[0-9]'", timeout=30)
            if tasks.exit_code == 0:
                assert int(tasks.stdout.strip()) <= 4096  # the pids limit holds
        except errors.OomTerminated:
            assert bomb.info().state == "oom_terminated"  # contained by its memory cap instead
        except errors.RuntimeFailure:
            pass  # so full (pids or memory) that runc cannot start a process in it: contained too
        except errors.EnvironmentGone:
            # the exec's shim could not even start (its kernel memory charged to the full cgroup)
            # and the environment is no longer running: contained, and typed (seen under load)
            assert bomb.info().state in ("running", "oom_terminated")
        assert neighbour.exec("echo alive", timeout=30).stdout == "alive\n"
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
    # leaving the with-block destroyed both, bomb included (the module's leak check verifies)


def test_a_long_exec_blocks_nothing_else(client: Client) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    ended: list[BaseException] = []

    def long_exec() -> None:
        try:
            slow.exec("sleep 120")
        except errors.EnvironmentGone as exc:  # the destroy below ends it: the expected way out
            ended.append(exc)
        done.set()

    with _create(client) as slow:
        done = threading.Event()
        worker = threading.Thread(target=long_exec, daemon=True)
        worker.start()
        with ThreadPoolExecutor(max_workers=4) as pool:  # parallel creates, execs, destroys meanwhile
            envs = list(pool.map(lambda _: _create(client), range(4)))
            outs = list(pool.map(lambda e: e.exec("echo $TASK").stdout, envs))
            list(pool.map(lambda e: e.destroy(), envs))
        assert outs == ["app\n"] * 4
        assert slow.exec("echo meanwhile").stdout == "meanwhile\n"  # same env, concurrent exec
        assert not done.is_set()  # all of the above happened while the long exec still ran
    worker.join(timeout=30)  # the context manager's destroy ended the sleep
    assert not worker.is_alive()
    assert done.is_set() and len(ended) <= 1  # it ended by the destroy (or just before it), nothing else


def test_binary_changes_reach_the_evaluator(client: Client) -> None:
    with _create(client, evaluator={"groups": ["os/busybox:1", "repo/app:1"],
                                    "command": "test \"$(head -c 3 /work/app/blob.bin)\" = 'AB' && cat hello.txt | grep -q fixed"}) as env:
        env.write_file("/work/app/blob.bin", b"AB\x00\x01\x02\xff")
        env.exec("echo fixed > hello.txt")
        assert "blob.bin" in env.diff() and "GIT binary patch" in env.diff(binary="patch")
        assert env.evaluate().reward == 1.0


def test_a_destroy_during_its_create_waits_for_the_build_and_leaves_nothing(node, client, monkeypatch):
    """A delete racing a create (a client that gave up, the node stopping): the teardown waits
    for the build instead of unmounting under it; the create answers `environment_gone`."""
    import threading

    service, _ = node
    real = service.stages.build
    entered, release = threading.Event(), threading.Event()

    def slow_build(rec, timings, prepared=None):
        entered.set()
        assert release.wait(60)
        return real(rec, timings, prepared)

    monkeypatch.setattr(service.stages, "build", slow_build)
    out: dict = {}

    def create() -> None:
        try:
            out["r"] = service.create(plan())
        except Exception as e:  # noqa: BLE001 - inspected below
            out["r"] = e

    t = threading.Thread(target=create)
    t.start()
    assert entered.wait(60)
    env_id = next(r.id for r in list(service._envs.values()) if r.state == "creating")
    remember(NODE_ROOT[0], env_id)
    service.destroy(env_id)  # asynchronous: returns at once, the teardown waits for the build
    assert client.get(env_id).info().state == "destroying"
    release.set()
    t.join(120)
    assert isinstance(out.get("r"), errors.EnvironmentGone), out
    _destroyed(client, env_id)
    _all_destroyed(service)  # earlier tests' background teardowns share the node root
    assert not any(leftovers(NODE_ROOT[0]).values()), leftovers(NODE_ROOT[0])
