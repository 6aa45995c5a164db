"""The unmodified `e2b` SDK (sync) against a real node: sandboxes from a published template,
commands (foreground, streamed, background, stdin, signals, reconnect), files, timeouts,
listing, kill, and the SDK's own exceptions for bad input."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

from e2b import (  # noqa: E402
    ALL_TRAFFIC, AuthenticationException, CommandExitException, FileNotFoundException, FileType,
    InvalidArgumentException, NotFoundException, Sandbox, SandboxException, SandboxNotFoundException,
    SandboxNotRunningException, SandboxQuery,
)


@pytest.fixture
def sbx(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=180, metadata={"suite": "sync"})
    try:
        yield box
    finally:
        box.kill()


def test_create_run_and_kill(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=120)
    assert box.sandbox_id.startswith("e")
    r = box.commands.run("echo hello; echo oops >&2; cat /work/app/hello.txt")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "hello\nbug\n", "oops\n")  # mutation applied
    assert box.is_running()
    info = box.get_info()
    assert info.template_id == e2b_node.template and info.sandbox_id == box.sandbox_id
    assert box.kill() is True
    assert not box.is_running()
    assert Sandbox.kill(box.sandbox_id) is False  # 404 after the 204
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(box.sandbox_id)
    # the node lists it as destroying until its teardown has reclaimed everything, then not at all
    assert [e.state for e in e2b_node.service.list() if e.id == box.sandbox_id] in ([], ["destroying"])


def test_nonzero_exit_raises_the_sdk_exception(sbx):
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stdout == "out\n" and info.value.stderr == "err\n"


def test_output_is_streamed_while_the_command_runs(sbx):
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    r = sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.4; done",
                         on_stdout=lambda s: seen.append((time.monotonic() - t0, s)))
    end = time.monotonic() - t0
    assert "".join(s for _, s in seen) == r.stdout == "line1\nline2\nline3\n"
    assert seen[0][0] < end - 0.4  # the first line came ~0.8 s before the command ended


def test_envs_cwd_and_sandbox_env_vars(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=60, envs={"FROM_CREATE": "c"})
    try:
        r = box.commands.run("echo $FROM_CREATE $FROM_RUN; pwd", envs={"FROM_RUN": "r"}, cwd="/tmp")
        assert r.stdout == "c r\n/tmp\n"
    finally:
        box.kill()


def test_background_command_list_and_kill(sbx):
    handle = sbx.commands.run("echo started; touch /tmp/ready; sleep 60", background=True)
    procs = {p.pid: p for p in sbx.commands.list()}
    assert handle.pid in procs
    assert procs[handle.pid].args[-1] == "echo started; touch /tmp/ready; sleep 60"
    deadline = time.monotonic() + 20
    while not sbx.files.exists("/tmp/ready") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as info:
        handle.wait()
    assert info.value.exit_code == -1  # envd's report of a killed process
    assert "started\n" in info.value.stdout
    assert handle.pid not in {p.pid for p in sbx.commands.list()}
    assert sbx.commands.kill(handle.pid) is False  # gone: NOT_FOUND -> False


def test_stdin_send_and_close(sbx):
    handle = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "abc\n")
    sbx.commands.send_stdin(handle.pid, b"def\n")
    sbx.commands.close_stdin(handle.pid)
    r = handle.wait()
    assert r.stdout == "abc\ndef\ndone\n"


def test_stdin_to_a_process_without_stdin_is_refused(sbx):
    handle = sbx.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(InvalidArgumentException):
            sbx.commands.send_stdin(handle.pid, "x")
    finally:
        handle.kill()


def test_reconnect_to_a_background_command(sbx):
    handle = sbx.commands.run("while [ ! -f /tmp/go ]; do sleep 0.05; done; echo late; exit 4", background=True)
    handle.disconnect()
    again = sbx.commands.connect(handle.pid)
    sbx.files.write("/tmp/go", "")
    with pytest.raises(CommandExitException) as info:
        again.wait()
    assert info.value.exit_code == 4 and info.value.stdout == "late\n"


def test_command_timeout_kills_the_process(sbx):
    from e2b import TimeoutException

    with pytest.raises((TimeoutException, CommandExitException)):
        sbx.commands.run("sleep 30", timeout=1)
    deadline = time.monotonic() + 10
    while sbx.commands.list() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sbx.commands.list() == []  # killed at its deadline, not left running


def test_files_write_read_list_and_tree_ops(sbx):
    info = sbx.files.write("/work/notes/a.txt", "alpha\n")
    assert info.path == "/work/notes/a.txt" and info.name == "a.txt"
    assert sbx.files.read("/work/notes/a.txt") == "alpha\n"
    sbx.files.write("/work/notes/b.bin", io.BytesIO(b"\x00\x01\x02"))  # octet-stream upload
    assert bytes(sbx.files.read("/work/notes/b.bin", format="bytes")) == b"\x00\x01\x02"
    sbx.files.write_files([{"path": "/work/notes/c.txt", "data": "c"}, {"path": "/work/d/e.txt", "data": "e"}])
    names = {e.name: e for e in sbx.files.list("/work/notes")}
    assert set(names) == {"a.txt", "b.bin", "c.txt"}
    assert names["a.txt"].type == FileType.FILE and names["a.txt"].size == 6
    deep = {e.path for e in sbx.files.list("/work", depth=2)}
    assert {"/work/notes", "/work/notes/a.txt", "/work/d/e.txt"} <= deep
    assert sbx.files.exists("/work/notes/a.txt") and not sbx.files.exists("/work/notes/zzz")
    assert sbx.files.get_info("/work/notes").type == FileType.DIR
    assert sbx.files.make_dir("/work/new/sub") is True
    assert sbx.files.make_dir("/work/new/sub") is False  # already there
    moved = sbx.files.rename("/work/notes/a.txt", "/work/new/sub/a.txt")
    assert moved.path == "/work/new/sub/a.txt"
    assert sbx.commands.run("cat /work/new/sub/a.txt").stdout == "alpha\n"  # seen inside too
    sbx.files.remove("/work/new")
    assert not sbx.files.exists("/work/new/sub/a.txt")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/work/notes/missing.txt")


def test_symlinks_never_lead_out_of_the_sandbox(sbx, tmp_path: Path):
    sbx.commands.run("ln -s /etc /tmp/evil && ln -s ../../../.. /tmp/up")
    with pytest.raises(SandboxException):
        sbx.files.read("/tmp/evil/passwd")  # absolute symlink: refused, not the host's /etc
    with pytest.raises(SandboxException):
        sbx.files.write("/tmp/up/x", "no")  # would climb above the root
    link = sbx.files.get_info("/tmp/evil")
    assert link.type == FileType.SYMLINK and link.symlink_target == "/etc"
    sbx.files.remove("/tmp/evil")  # the link itself, not what it names
    assert Path("/etc/passwd").exists()
    assert not sbx.files.exists("/tmp/evil")


def test_timeout_list_and_connect(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=120, metadata={"suite": "list"})
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "list"})).next_items()
        assert [s.sandbox_id for s in listed] == [box.sandbox_id]
        assert listed[0].template_id == e2b_node.template
        again = Sandbox.connect(box.sandbox_id)
        assert again.commands.run("echo via-connect").stdout == "via-connect\n"
        box.set_timeout(1)
        deadline = time.monotonic() + 15
        while box.is_running() and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not box.is_running()  # the node's reaper ended it at the new deadline
        assert box.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
        with pytest.raises(SandboxNotRunningException):
            box.commands.run("echo too late")
    finally:
        Sandbox.kill(box.sandbox_id)


def test_list_filters_and_pages(e2b_node):
    from datetime import datetime, timedelta, timezone

    from e2b import SandboxState

    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    boxes = [Sandbox.create(e2b_node.template, timeout=120, metadata={"suite": "pages", "i": str(i)})
             for i in range(3)]
    try:
        boxes[1].pause()
        q = SandboxQuery(metadata={"suite": "pages"})
        pager = Sandbox.list(query=q, limit=2)
        first = pager.next_items()
        assert pager.has_next and len(first) == 2
        rest = pager.next_items()
        assert not pager.has_next
        assert [s.sandbox_id for s in first + rest] == [b.sandbox_id for b in boxes]  # oldest first
        paused = Sandbox.list(query=SandboxQuery(metadata={"suite": "pages"}, state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [boxes[1].sandbox_id]
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": "pages"}, state=[SandboxState.RUNNING])).next_items()
        assert {s.sandbox_id for s in running} == {boxes[0].sandbox_id, boxes[2].sandbox_id}
        later = Sandbox.list(query=SandboxQuery(metadata={"suite": "pages"},
                                                started_after=datetime.now(timezone.utc) + timedelta(hours=1)))
        assert later.next_items() == []
        since = Sandbox.list(query=SandboxQuery(metadata={"suite": "pages"}, started_after=before,
                                                template=e2b_node.template.split(":")[0])).next_items()
        assert len(since) == 3
        other = Sandbox.list(query=SandboxQuery(metadata={"suite": "pages"}, template="tasks/other")).next_items()
        assert other == []
    finally:
        for b in boxes:
            b.kill()


def test_bad_input_gets_the_sdk_exceptions(e2b_node, sbx):
    with pytest.raises(SandboxException) as info:
        Sandbox.create("tasks/no-such-template:1", timeout=30)
    assert "template_not_found" in str(info.value)
    with pytest.raises(AuthenticationException):
        Sandbox.create(e2b_node.template, api_key="wrong-key")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="wrong-key").next_items()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("eunknown00000")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout("eunknown00000", 30)
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999999)
    with pytest.raises(InvalidArgumentException):
        sbx.files.list("/work/app/hello.txt")  # not a directory


def test_large_output_arrives_whole(sbx):
    r = sbx.commands.run("yes 0123456789abcdef | head -c 5000000; echo; echo tail >&2", timeout=120)
    assert len(r.stdout) == 5_000_001 and r.stdout.startswith("0123456789abcdef\n") and r.stderr == "tail\n"


def test_a_create_retried_with_its_idempotency_key_returns_the_same_sandbox(e2b_node):
    first = Sandbox.create(e2b_node.template, timeout=120, idempotency_key="e2b-retry-1")
    try:
        again = Sandbox.create(e2b_node.template, timeout=120, idempotency_key="e2b-retry-1")
        assert again.sandbox_id == first.sandbox_id
        assert again.commands.run("echo same").stdout == "same\n"  # its access token works too
        assert [b.sandbox_id for b in Sandbox.list(query=SandboxQuery()).next_items()].count(first.sandbox_id) == 1
    finally:
        first.kill()


def test_fork_pause_and_connect_resume(e2b_node):
    """`Sandbox.fork` (the filesystem: rollstack does not carry processes over), `pause`, and
    `Sandbox.connect` resuming a paused sandbox, with the unmodified SDK."""
    box = Sandbox.create(e2b_node.template, timeout=120)
    kids: list = []
    try:
        box.files.write("/work/app/state.txt", "cut")
        kids = box.fork(count=2, timeout=60)
        assert len(kids) == 2 and all(isinstance(k, Sandbox) for k in kids), kids
        assert len({k.sandbox_id for k in kids} | {box.sandbox_id}) == 3
        for i, k in enumerate(kids):
            assert k.files.read("/work/app/state.txt") == "cut"
            k.files.write("/work/app/state.txt", f"child {i}")
            assert k.commands.run("cat /work/app/hello.txt").stdout == "bug\n"  # the task's state too
        assert box.files.read("/work/app/state.txt") == "cut"  # children write their own copies
        box.pause()
        states = {s.sandbox_id: s.state for s in Sandbox.list().next_items()}
        assert str(states[box.sandbox_id]).lower().endswith("paused"), states
        with pytest.raises(SandboxException):
            box.commands.run("true")  # frozen: environment_paused until resumed
        same = Sandbox.connect(box.sandbox_id)
        assert same.commands.run("cat /work/app/state.txt").stdout == "cut"
    finally:
        for k in kids:
            if isinstance(k, Sandbox):
                k.kill()
        box.kill()


def _state(box: Sandbox) -> str:
    return str({s.sandbox_id: s.state for s in Sandbox.list().next_items()}.get(box.sandbox_id)).lower()


def _until(what, deadline_s: float = 60):
    deadline = time.monotonic() + deadline_s
    while not what():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.2)


def test_lifecycle_pauses_at_the_timeout_and_auto_resumes(e2b_node):
    """`lifecycle={"on_timeout": "pause", "auto_resume": True}`: the node's reaper pauses the
    sandbox at its timeout (processes frozen, files kept) instead of killing it; the next envd
    call resumes it, with its timeout again. Without auto_resume only a connect resumes."""
    auto = Sandbox.create(e2b_node.template, timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    manual = Sandbox.create(e2b_node.template, timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        for box in (auto, manual):
            box.files.write("/work/app/kept.txt", box.sandbox_id)
            box.commands.run("sleep 600", background=True)  # a process the pause must keep
        _until(lambda: _state(auto).endswith("paused") and _state(manual).endswith("paused"))
        assert auto.commands.run("cat /work/app/kept.txt").stdout == auto.sandbox_id  # resumed by the call
        assert _state(auto).endswith("running")
        assert "sleep 600" in auto.commands.run("ps").stdout  # frozen in place, not restarted
        with pytest.raises(SandboxException):
            manual.commands.run("true")  # paused until a connect
        again = Sandbox.connect(manual.sandbox_id)
        assert again.files.read("/work/app/kept.txt") == manual.sandbox_id
        _until(lambda: _state(auto).endswith("paused"))  # its 2 s again, then paused again
    finally:
        auto.kill()
        manual.kill()
    with pytest.raises(SandboxException):
        Sandbox.create(e2b_node.template, timeout=30, lifecycle={"on_timeout": "kill", "auto_resume": True})


def test_get_metrics_from_the_provisioners_samples(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=60)
    try:
        box.commands.run("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
        deadline = time.monotonic() + 60
        metrics = box.get_metrics()
        while not metrics and time.monotonic() < deadline:
            time.sleep(0.5)
            metrics = box.get_metrics()
        assert metrics, "no samples within 60 s"
        m = metrics[-1]
        assert m.cpu_count >= 1 and m.mem_total > 0 and 0 <= m.cpu_used_pct <= 100 * m.cpu_count * 8
        assert metrics == sorted(metrics, key=lambda x: x.timestamp)
        assert box.get_metrics(start=m.timestamp) and all(x.timestamp >= m.timestamp.replace(microsecond=0)
                                                          for x in box.get_metrics(start=m.timestamp))
    finally:
        box.kill()


@pytest.fixture
def internet(tmp_path: Path):
    """A web server in a network namespace of the test's own, on TEST-NET-2 (never routed for
    real), reached through the node's routes like any host past it."""
    import secrets

    from rollstack_bench.netlab import Upstream, sh

    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello").write_text("from the internet\n")
    up = Upstream(tmp_path / "www", address=f"198.51.100.{2 + secrets.randbelow(250)}")
    try:
        sh("ip", "-n", up.netns, "route", "del", "default")
        up.serve(8080)
        yield up
    finally:
        up.close()


def test_egress_options_at_create(e2b_node, internet):
    """`allow_internet_access` and `network={allow_out, deny_out}` at create: the template plan
    with that egress policy (docs/e2b.md)."""
    fetch = f"timeout 5 wget -q -O - http://{internet.addr}:8080/hello"
    boxes = {
        "open": Sandbox.create(e2b_node.template, timeout=60, allow_internet_access=True),
        "allowed": Sandbox.create(e2b_node.template, timeout=60,
                                  network={"allow_out": [internet.addr], "deny_out": [ALL_TRAFFIC]}),
        "other": Sandbox.create(e2b_node.template, timeout=60,
                                network={"allow_out": ["198.18.0.1"], "deny_out": [ALL_TRAFFIC]}),
        "offline": Sandbox.create(e2b_node.template, timeout=60, allow_internet_access=False),
    }
    try:
        def reached(name: str) -> bool:
            try:
                return boxes[name].commands.run(fetch, timeout=30).stdout == "from the internet\n"
            except CommandExitException:
                return False

        # ("open" is outbound: it forwards through the default routes' interfaces; the test's
        # upstream hangs off its own veth, whose forwarding the "allowed" create switched on)
        assert {name: reached(name) for name in boxes} == {"open": True, "allowed": True, "other": False,
                                                            "offline": False}
        assert "eth0" not in boxes["offline"].commands.run("cat /proc/net/dev").stdout  # no interface at all

        # update_network replaces the whole policy of a running sandbox, at once
        boxes["allowed"].update_network({"deny_out": [ALL_TRAFFIC]})
        boxes["other"].update_network({"allow_out": [internet.addr], "deny_out": [ALL_TRAFFIC]})
        assert (reached("allowed"), reached("other")) == (False, True)
        boxes["allowed"].update_network({})  # nothing given: E2B's default, everything allowed
        assert reached("allowed")
        with pytest.raises(SandboxException, match="created without a network"):
            boxes["offline"].update_network({"allow_out": [internet.addr]})  # no namespace to re-policy
        with pytest.raises(SandboxException, match="denyOut"):
            boxes["other"].update_network({"deny_out": ["10.0.0.0/8"]})
        assert reached("other")  # a refused update changes nothing
        # the same through the native API and SDK (`PUT /v1/environments/{id}/network`)
        from rollstack import Client

        with Client(e2b_node.url, token=e2b_node.token) as client:
            info = client.get(boxes["other"].sandbox_id).set_network("none")
            assert info.state == "running" and not reached("other")
    finally:
        for box in boxes.values():
            box.kill()


@pytest.mark.parametrize("options, field", [
    ({"network": {"deny_out": ["10.0.0.0/8"]}}, "network.denyOut"),
    ({"network": {"allow_out": ["10.0.0.0/8"], "deny_out": [ALL_TRAFFIC], "dns_servers": ["1.1.1.1"]}},
     "network.dnsServers"),
])
def test_create_options_rollstack_does_not_honour_are_refused_by_name(e2b_node, options, field):
    with pytest.raises(SandboxException) as info:  # a 400 naming the field
        Sandbox.create(e2b_node.template, timeout=30, metadata={"refused": "1"}, **options)
    assert f"400: body: Value error, {field}:" in str(info.value)
    assert not [s for s in Sandbox.list().next_items() if s.metadata.get("refused")]


def test_a_filesystem_snapshot_is_a_template(e2b_node):
    box = Sandbox.create(e2b_node.template, timeout=120)
    try:
        box.files.write("/work/app/state.txt", "snap")
        with pytest.raises(SandboxException):
            box.create_snapshot(mode="full")  # memory kept: rollstack's are filesystem-only
        info = box.create_snapshot()  # no mode: the filesystem (documented)
        assert info.snapshot_id.startswith(f"snapshots/{box.sandbox_id}:")
        named = box.create_snapshot("snap/e2b", mode="filesystem")
        assert named.names == ["snap/e2b"] and named.snapshot_id != info.snapshot_id
    finally:
        box.kill()
    restored = Sandbox.create(info.snapshot_id, timeout=60)  # on any node sharing the store
    try:
        assert restored.files.read("/work/app/state.txt") == "snap"
    finally:
        restored.kill()
    mine = Sandbox.list_snapshots(sandbox_id=box.sandbox_id)
    assert sorted(s.snapshot_id for s in mine.next_items()) == sorted([info.snapshot_id, named.snapshot_id])
    assert not mine.has_next
    paged = Sandbox.list_snapshots(sandbox_id=box.sandbox_id, limit=1)
    assert len(paged.next_items()) == 1 and paged.has_next and len(paged.next_items()) == 1
    assert [s.snapshot_id for s in Sandbox.list_snapshots(name="snap/e2b").next_items()] == [named.snapshot_id]
    assert Sandbox.delete_snapshot(named.snapshot_id) is True
    assert Sandbox.delete_snapshot(named.snapshot_id) is False  # gone: E2B's 404
    assert Sandbox.delete_snapshot(e2b_node.template) is False  # a template that is no snapshot is kept
    assert [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=box.sandbox_id).next_items()] == [info.snapshot_id]


def test_volumes_outlive_sandboxes_and_their_content_api_stays_inside(e2b_node):
    from e2b import Volume, VolumeException, VolumeNotFoundException, VolumePathNotFoundException

    vol = Volume.create("sdk-vol")
    try:
        assert Volume.connect(vol.volume_id).name == "sdk-vol"
        assert "sdk-vol" in [v.name for v in Volume.list()]
        written = vol.write_file("/seed/in.txt", "seeded\n", mode=0o640)
        assert (written.path, written.size, written.mode) == ("/seed/in.txt", 7, 0o640)
        vol.make_dir("/empty", force=True)
        assert {e.name for e in vol.list("/")} == {"seed", "empty"}
        box = Sandbox.create(e2b_node.template, timeout=120, volume_mounts={"/mnt/vol": vol})
        try:
            assert box.commands.run("cat /mnt/vol/seed/in.txt").stdout == "seeded\n"
            box.commands.run("echo from-the-sandbox > /mnt/vol/out.txt")
            box.files.write("/mnt/vol/via-files.txt", "envd")  # the files API follows the mount
            assert Sandbox.get_info(box.sandbox_id).volume_mounts == [{"name": "sdk-vol", "path": "/mnt/vol"}]
        finally:
            box.kill()
        assert vol.read_file("/out.txt") == "from-the-sandbox\n"  # outlived the sandbox
        assert vol.read_file("/via-files.txt", format="bytes") == b"envd"
        again = Sandbox.create(e2b_node.template, timeout=60, volume_mounts={"/data": "sdk-vol"})
        try:
            assert again.commands.run("cat /data/out.txt").stdout == "from-the-sandbox\n"
        finally:
            again.kill()
        info = vol.update_metadata("/out.txt", uid=1000, gid=1000, mode=0o600)
        assert (info.uid, info.gid, info.mode) == (1000, 1000, 0o600)
        vol.remove("/seed")
        assert not vol.exists("/seed/in.txt")
        with pytest.raises(VolumePathNotFoundException):
            vol.read_file("/missing.txt")
        with pytest.raises(VolumeException):  # never outside the volume
            vol.read_file("/../../etc/hostname")
        with pytest.raises(SandboxException):  # a volume that is not there: refused at create
            Sandbox.create(e2b_node.template, timeout=30, volume_mounts={"/data": "no-such-volume"})
        with pytest.raises(VolumeException):
            Volume.create("../escape")
    finally:
        assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(VolumeNotFoundException):
        Volume.connect("sdk-vol")
