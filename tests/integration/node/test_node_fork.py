"""Fork (docs/fork.md), as root on real runc, overlayfs and the lazy store: children start from
the parent's filesystem at the cut and are isolated from it and from each other; the parent runs
on unchanged; diffs and evaluations of a child cover the parent's changes; the frozen layer lives
exactly as long as an environment stacks it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from node_helpers import leftovers, plan, remember, serve_node, sh as _sh
from rollstack import Client, errors
from rollstack.node.forks import layer_names

pytestmark = pytest.mark.integration
TOKEN = "fork-token"


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fork-root")
    with serve_node(root, corpus, TOKEN, max_environments=12, reap_interval=0.5) as (service, server):
        with Client(server.url, token=TOKEN, lease=None) as client:
            yield root, service, client



def _forks(root: Path) -> list[str]:
    return layer_names(root / "forks")


@pytest.mark.parametrize("userns", [False, True])
def test_children_start_from_the_cut_and_are_isolated(node, userns: bool) -> None:
    root, service, client = node
    parent = client.create(plan(security={"userns": userns}))
    remember(root, parent.id)
    _sh(parent, "echo parent-state > state.txt && mkdir -p deep/dir && echo x > deep/dir/f"
                " && chown 1000:1000 deep/dir/f && rm hello.txt.orig 2>/dev/null; rm -f gone.txt; true")
    before = _sh(parent, "ls -la /work/app | sort")
    kids = parent.fork(3)
    for k in kids:
        remember(root, k.id)
    try:
        assert len(_forks(root)) == 1  # one frozen copy, shared by the three
        assert _sh(parent, "ls -la /work/app | sort") == before  # the parent runs on, unchanged
        _sh(parent, "echo after-the-cut > later.txt")
        for i, k in enumerate(kids):
            assert _sh(k, "cat state.txt") == "parent-state\n"
            assert _sh(k, "stat -c %u deep/dir/f") == "1000\n"  # owners as the parent saw them
            assert _sh(k, "test -e later.txt && echo yes || echo no") == "no\n"
            _sh(k, f"echo child-{i} > mine.txt && echo more >> state.txt")
        for i, k in enumerate(kids):  # each child's writes are its own
            assert _sh(k, "cat mine.txt") == f"child-{i}\n"
            assert _sh(k, "cat state.txt") == "parent-state\nmore\n"
        assert _sh(parent, "cat state.txt") == "parent-state\n"
        assert _sh(parent, "test -e mine.txt && echo yes || echo no") == "no\n"
        diff = kids[0].diff()  # the parent's changes and the child's, against the stack
        assert "b/work/app/state.txt" in diff and "+more" in diff and "+parent-state" in diff
        assert "b/work/app/mine.txt" in diff and "later.txt" not in diff
        assert "b/work/app/hello.txt" in diff  # the task's mutation (in the parent's upper) too
        assert kids[0].evaluate().reward == parent.evaluate().reward
        parent.destroy()  # the children keep working on the frozen layer
        assert _sh(kids[1], "cat state.txt") == "parent-state\nmore\n"
        assert len(_forks(root)) == 1
    finally:
        parent.destroy()
        for k in kids:
            k.destroy()
    service.wait_destroyed(120)
    assert _forks(root) == []  # the last environment stacking it is gone: so is the layer


def _proc_state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]


def test_a_fork_holds_the_nodes_background_work_stopped(node, monkeypatch) -> None:
    """The layer extraction and EROFS builds (registered with the node's Foreground) are stopped
    for a fork's cut and binds, and run again after it (host.foreground)."""
    import subprocess
    import sys

    root, service, client = node
    fg = service.stages.lowers.foreground
    bg = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    seen: list[str] = []
    fork_source = service.stages.fork_source

    def observed(rec):
        end = time.monotonic() + 30  # a generous wait on a condition
        while _proc_state(bg.pid) != "T" and time.monotonic() < end:
            time.sleep(0.01)
        seen.append(_proc_state(bg.pid))
        return fork_source(rec)

    monkeypatch.setattr(service.stages, "fork_source", observed)
    parent = client.create(plan())
    remember(root, parent.id)
    fg.register(bg.pid)
    try:
        while time.monotonic() < fg._run_until:  # a stop by an earlier fork: its run-time first
            time.sleep(0.01)
        kids = parent.fork(2)
        assert seen == ["T"]  # stopped during the cut
        end = time.monotonic() + 30
        while _proc_state(bg.pid) == "T" and time.monotonic() < end:
            time.sleep(0.01)
        assert _proc_state(bg.pid) != "T"  # and running again after the fork
        for k in kids:
            k.destroy()
    finally:
        fg.unregister(bg.pid)
        bg.kill()
        bg.wait(30)
        parent.destroy()


def test_a_fork_of_a_fork_and_bad_input(node) -> None:
    root, service, client = node
    parent = client.create(plan())
    remember(root, parent.id)
    try:
        _sh(parent, "echo one > one.txt")
        (child,) = parent.fork()
        remember(root, child.id)
        _sh(child, "echo two > two.txt")
        (grandchild,) = child.fork()
        remember(root, grandchild.id)
        assert _sh(grandchild, "cat one.txt two.txt") == "one\ntwo\n"
        assert "b/work/app/one.txt" in grandchild.diff() and "b/work/app/two.txt" in grandchild.diff()
        assert len(_forks(root)) == 2
        for bad in (0, 257):
            with pytest.raises(errors.InvalidRequest):
                parent.fork(bad)
        with pytest.raises(errors.InsufficientCapacity):
            parent.fork(64)  # all or none: nothing is left of a fork the node cannot hold
        child.destroy()
        grandchild.destroy()
    finally:
        parent.destroy()
    with pytest.raises(errors.EnvironmentNotFound):
        parent.fork()
    service.wait_destroyed(120)
    assert _forks(root) == []


def test_fork_destroy_cycles_leave_nothing(node) -> None:
    root, service, client = node
    parent = client.create(plan())
    remember(root, parent.id)
    try:
        for i in range(10):  # bounded; `rollstack bench fork` runs the long version
            _sh(parent, f"echo {i} > n.txt")
            kids = parent.fork(2)
            for k in kids:
                remember(root, k.id)
                assert _sh(k, "cat n.txt") == f"{i}\n"
                k.destroy()
    finally:
        parent.destroy()
    service.wait_destroyed(120)
    assert _forks(root) == [] and not any((left := leftovers(root, service)).values()), left


def _read_deep(root: Path, parts: list[str]) -> bytes:
    """A file below a path longer than PATH_MAX, one directory descriptor at a time."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        try:
            return os.read(leaf, 100)
        finally:
            os.close(leaf)
    finally:
        os.close(fd)


def test_a_tree_deeper_than_the_copy_and_rmtree_go_forks_and_leaves_nothing(node) -> None:
    """5,000 nested directories (an environment can make them): rollstack-treecp hands such a tree
    to cp -a, and shutil.rmtree's recursion limit to rm -rf (host.tree), so the fork works and
    destroying both leaves nothing."""
    root, service, client = node
    parent = client.create(plan())
    remember(root, parent.id)
    try:  # five 1,000-deep trees moved into one another (each path stays under PATH_MAX)
        _sh(parent, "p=$(i=0; while [ $i -lt 1000 ]; do printf d/; i=$((i+1)); done); "
                    "for t in 1 2 3 4 5; do mkdir -p t$t/$p || exit 1; done; echo bottom > t5/${p}f; "
                    "for t in 5 4 3 2; do mv t$t t$((t-1))/$p || exit 1; done")
        kid = parent.fork()[0]
        remember(root, kid.id)
        parts = [p for t in range(1, 6) for p in [f"t{t}", *["d"] * 1000]] + ["f"]
        assert _read_deep(service._get(kid.id).runtime.rootfs / "work" / "app", parts) == b"bottom\n"
        for env in (parent, kid):  # deeper than the diff's walk goes: a typed error, nothing left
            with pytest.raises(errors.RuntimeFailure, match="too deep"):
                env.diff()
        assert [p.name for p in (root / "envs" / kid.id).iterdir() if p.name.startswith("diff-")] == []
        kid.destroy()
    finally:
        parent.destroy()
    service.wait_destroyed(120)
    assert _forks(root) == [] and not any((left := leftovers(root, service)).values()), left


def test_a_retried_fork_with_its_key_returns_the_same_children(node) -> None:
    """A fork whose answer was lost is retried with its Idempotency-Key (over HTTP): the same
    children, no second cut; the same key for another request is a conflict; no key, new ones."""
    root, service, client = node
    parent = client.create(plan())
    remember(root, parent.id)
    try:
        _sh(parent, "echo one > n.txt")
        first = parent.fork(2, idempotency_key="fork-retry-1")
        for k in first:
            remember(root, k.id)
        made = service.stages.forks.made
        _sh(parent, "echo two > n.txt")
        again = parent.fork(2, idempotency_key="fork-retry-1")
        assert [k.id for k in again] == [k.id for k in first] and service.stages.forks.made == made
        assert _sh(again[1], "cat n.txt") == "one\n"
        with pytest.raises(errors.IdempotencyConflict):
            parent.fork(3, idempotency_key="fork-retry-1")
        with pytest.raises(errors.InvalidRequest):
            parent.fork(1, idempotency_key="bad key")
        other = parent.fork(1)
        remember(root, other[0].id)
        assert other[0].id not in {k.id for k in first} and _sh(other[0], "cat n.txt") == "two\n"
        for k in [*first, *other]:
            k.destroy()
    finally:
        parent.destroy()


def test_pause_freezes_gives_quota_back_and_resume_thaws(node) -> None:
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    try:
        _sh(env, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/tick; done) >/dev/null 2>&1 &")
        committed = service.stages.provisioner.committed()
        info = env.pause()
        assert info.state == "paused" and env.info().state == "paused"
        assert service.stages.provisioner.committed()["cpu"] < committed["cpu"]  # given back
        tick = env.read_file("/tmp/tick")  # files stay readable while frozen
        with pytest.raises(errors.EnvironmentPaused):
            env.exec(["true"])
        with pytest.raises(errors.EnvironmentPaused):
            env.fork()
        assert env.read_file("/tmp/tick") == tick  # nothing runs
        assert env.pause().state == "paused"  # idempotent
        assert env.resume().state == "running"
        assert env.resume().state == "running"  # idempotent
        assert _sh(env, "echo back") == "back\n"
        env.pause()
    finally:
        env.destroy()  # a paused environment is destroyed like any other
    service.wait_destroyed(120)
    with pytest.raises(errors.EnvironmentNotFound):
        env.resume()


def test_a_command_whose_timeout_passes_while_paused(node) -> None:
    """An exec runs, the environment is frozen, the exec's timeout passes: the caller gets
    `environment_paused` (not `environment_gone`: it is alive), and the resume ends the command."""
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(env.exec(["/bin/sh", "-c", "echo $$ > /tmp/slow.pid; exec sleep 600"], timeout=1))
        except BaseException as e:  # noqa: BLE001 - what the test checks
            outcome.append(e)

    runner = threading.Thread(target=run)
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while b"" == _read_or_empty(env, "/tmp/slow.pid"):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        env.pause()
        runner.join(120)
        assert not runner.is_alive() and isinstance(outcome[0], errors.EnvironmentPaused), outcome
        assert env.info().state == "paused"
        env.resume()
        deadline = time.monotonic() + 60  # its shim, thawed, finds the node gone and ends it
        while "sleep 600" in _sh(env, "ps -o args"):
            assert time.monotonic() < deadline, "the timed-out command outlived the resume"
            time.sleep(0.1)
    finally:
        env.destroy()


def _read_or_empty(env, path: str) -> bytes:
    try:
        return env.read_file(path)
    except errors.RollstackError:
        return b""


@pytest.mark.parametrize("userns", [False, True])
def test_a_snapshot_starts_on_a_fresh_node(node, corpus: str, tmp_path: Path, userns: bool) -> None:
    """`env.snapshot("NAME:TAG")` publishes the environment's filesystem; a second node, with
    its own root and nothing cached, starts an environment from it (lazily, like any plan)."""
    root, service, client = node
    env = client.create(plan(security={"userns": userns}))
    remember(root, env.id)
    name = f"snap/app{int(userns)}:t{tmp_path.name[-6:]}"
    try:
        _sh(env, "echo snapped > state.txt && rm -f /bin/true.bak && chown 1000 state.txt"
                 " && mkdir -p gone && rm -rf gone")
        (child,) = env.fork()  # a fork's snapshot carries the layers it was forked from
        remember(root, child.id)
        _sh(child, "echo child >> state.txt && ls /bin /work/app > /dev/null")
        published = service.stages.lazy.stats()["shared_traces_published"]
        snap = child.snapshot(name)
        assert snap.plan == name and snap.files >= 1 and snap.bytes > 0
        shares_its_reads = snap.trace_chunks > 0  # 0 only when its lowers are local copies (no FUSE reads)
        deadline = time.monotonic() + 60  # published by the lazy store in the background
        while shares_its_reads and service.stages.lazy.stats()["shared_traces_published"] < published + 2:
            assert time.monotonic() < deadline, "the snapshot's traces were not published"
            time.sleep(0.2)
        with pytest.raises(errors.AlreadyExists):
            child.snapshot(name)  # a name that exists is refused, nothing is replaced
        for bad in ("../../etc:x", "Name With Spaces:1", "x"):
            with pytest.raises(errors.InvalidRequest):
                child.snapshot(bad)
        _sh(child, "echo after >> state.txt")  # not in the snapshot
        child.destroy()
    finally:
        env.destroy()
    with serve_node(tmp_path / "other-node", corpus, TOKEN, max_environments=4) as (other_service, server):
        with Client(server.url, token=TOKEN, lease=None) as other:
            restored = other.create(name)
            try:
                if shares_its_reads:  # the fresh node prefetched what the parent read
                    deadline = time.monotonic() + 60
                    while (st := other_service.stages.lazy.env_stats(restored.id))["trace_lookup"] != "done":
                        assert time.monotonic() < deadline
                        time.sleep(0.1)
                    assert st["trace_source"] in ("shared", "stack-shared") and st["trace_prefetch_chunks"] > 0, st
                assert _sh(restored, "cat state.txt") == "snapped\nchild\n"
                assert _sh(restored, "stat -c %u state.txt") == "1000\n"
                assert _sh(restored, "cat hello.txt") == "bug\n"  # the task's state, not applied twice
            finally:
                restored.destroy()
            listed = other.snapshots()  # the store's, whichever node took them
            assert [(s.plan, s.source) for s in listed if s.plan == name] == [(name, child.id)]
            assert [s.plan for s in other.snapshots(source=child.id)] == [name]
            other.delete_snapshot(name)
            assert name not in [s.plan for s in other.snapshots()]
            for gone in (name, "no/such:snap"):
                with pytest.raises(errors.TemplateNotFound):
                    other.delete_snapshot(gone)
            with pytest.raises(errors.TemplateNotFound):
                other.create(name)


def test_setup_runs_once_and_a_group_is_forked_from_it(node) -> None:
    root, service, client = node
    setup = ["echo ran >> /work/app/setup.log", "echo $((6*7)) > /work/app/answer"]
    one = client.create(plan(setup=setup))
    remember(root, one.id)
    try:
        assert _sh(one, "cat setup.log answer") == "ran\n42\n"
        assert one.created.timings.setup > 0
    finally:
        one.destroy()
    group = client.create(plan(setup=setup), 3)
    for e in group:
        remember(root, e.id)
    try:
        assert [_sh(e, "cat setup.log") for e in group] == ["ran\n"] * 3  # once, before the fork
        assert all(e.created.timings.setup > 0 for e in group)
        assert len({e.id for e in group}) == 3
    finally:
        for e in group:
            e.destroy()
    live = {e.id for e in client.list()}
    with pytest.raises(errors.CommandFailed):
        client.create(plan(setup=["echo broken >&2; exit 3"]))
    with pytest.raises(errors.CommandFailed):
        client.create(plan(setup=["exit 4"]), 2)
    service.wait_destroyed(120)
    assert {e.id for e in client.list()} <= live  # a failed setup leaves no environment
    assert _forks(root) == []


def test_a_gvisor_parent_forks_and_snapshots_with_every_write_made_before_the_cut(node) -> None:
    """runsc keeps file data in its own kernel: the cut syncs it to the host's upper first."""
    root, service, client = node
    parent = client.create(plan(runtime="runsc"))
    remember(root, parent.id)
    try:
        _sh(parent, "echo new > new.txt && echo appended >> hello.txt"
                    " && dd if=/dev/zero of=big.bin bs=1k count=300 2>/dev/null && rm README")
        [kid] = parent.fork(1)
        remember(root, kid.id)
        assert _sh(kid, "cat new.txt hello.txt; wc -c < big.bin; test -e README && echo still || echo gone") == \
            "new\nbug\nappended\n307200\ngone\n"
        assert _sh(kid, "uname -r") == _sh(parent, "uname -r") != os.uname().release + "\n"  # gVisor's kernel too
        snap = parent.snapshot("gvisor/parent:1")
        try:
            again = client.create(snap.plan)
            remember(root, again.id)
            assert _sh(again, "cat new.txt; wc -c < big.bin") == "new\n307200\n"
        finally:
            client.delete_snapshot("gvisor/parent:1")
    finally:
        for env in client.list():
            client.destroy(env.id)
