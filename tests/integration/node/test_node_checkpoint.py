"""Checkpointed pauses (`pause(mode="checkpoint")`, rollstack.run.checkpoint), as root on real
runc, CRIU (built by `make setup`), overlayfs and the lazy store: the processes are dumped and
ended, files stay usable, `resume` brings the same processes back where they were; a restarted
agent re-adopts a checkpointed environment; what CRIU refuses leaves the environment running."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from node_helpers import leftovers, plan, remember, serve_node
from rollstack import Client, errors
from rollstack.node.config import NodeConfig
from rollstack.node.service import NodeService
from rollstack.run import checkpoint as ckpt
from rollstack.run import teardown

pytestmark = pytest.mark.integration
TOKEN = "checkpoint-token"
COUNTER = ("setsid sh -c 'echo $$ > /tmp/pid; i=0; while true; do i=$((i+1)); echo $i > /tmp/count; "
           "sleep 0.05; done' </dev/null >/dev/null 2>&1 & while [ ! -s /tmp/count ]; do sleep 0.01; done")


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    assert ckpt.find_criu() is not None, "CRIU is not built: `make setup` (third_party/criu/build.sh)"
    root = tmp_path_factory.mktemp("checkpoint-root")
    with serve_node(root, corpus, TOKEN, max_environments=8, reap_interval=0.5) as (service, server):
        with Client(server.url, token=TOKEN, lease=None) as client:
            yield root, service, client


def _processes_of(env_id: str) -> list[int]:
    """Host pids whose cgroup names the environment (its processes, wherever they are)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if env_id in Path(f"/proc/{pid}/cgroup").read_text():
                pids.append(int(pid))
        except OSError:
            continue
    return pids


@pytest.fixture
def runc_execs(node, monkeypatch) -> list[str]:
    """The container ids `runc exec` ran in from here on (execs the agent did not serve)."""
    _, service, _ = node
    runc = service.stages.runtime.runc
    seen: list[str] = []
    real = runc.exec

    def counted(container_id, *args, **kwargs):
        seen.append(container_id)
        return real(container_id, *args, **kwargs)

    monkeypatch.setattr(runc, "exec", counted)
    return seen


def _count(env) -> int:
    return int(env.read_file("/tmp/count").decode().strip() or 0)


def _grows(env, above: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while (n := _count(env)) <= above:
        assert time.monotonic() < deadline, f"the counter stayed at {n}"
        time.sleep(0.05)
    return n


@pytest.mark.parametrize("userns, network", [(False, "none"), (True, "none"), (False, "outbound"), (True, "outbound")],
                         ids=["plain", "userns", "network", "userns-network"])
def test_checkpoint_ends_the_processes_and_resume_brings_them_back(node, runc_execs, userns: bool,
                                                                    network: str) -> None:
    root, service, client = node
    env = client.create(plan(security={"userns": userns}, network=network))
    remember(root, env.id)
    try:
        assert env.exec(["/bin/sh", "-c", COUNTER]).exit_code == 0
        pid = env.read_file("/tmp/pid")
        info = env.pause("checkpoint")
        assert (info.state, info.pause_mode) == ("paused", "checkpoint")
        assert _processes_of(env.id) == []  # on disk, not in memory
        frozen = _count(env)
        time.sleep(0.3)
        assert _count(env) == frozen
        env.write_file("/tmp/note", "written while checkpointed\n")  # files stay usable
        with pytest.raises(errors.EnvironmentPaused):
            env.exec(["true"])
        with pytest.raises(errors.EnvironmentPaused):
            env.fork()
        with pytest.raises(errors.InvalidRequest):
            env.pause()  # frozen is another mode: resume first
        assert env.pause("checkpoint").pause_mode == "checkpoint"  # idempotent
        info = env.resume()
        assert (info.state, info.pause_mode) == ("running", None)
        _grows(env, frozen)  # the same loop goes on where it was
        assert env.read_file("/tmp/pid") == pid
        r = env.exec(["/bin/sh", "-c", "cat /tmp/note; kill -0 $(cat /tmp/pid) && echo alive"])
        assert r.stdout == "written while checkpointed\nalive\n", r
        again = env.pause("checkpoint")  # a second cycle, the agent inside the environment already
        assert again.pause_mode == "checkpoint" and env.resume().state == "running"
        _grows(env, _count(env))
        assert env.exec(["/bin/sh", "-c", "echo $$"]).stdout.strip().isdigit()
        assert runc_execs == []  # every exec went through the restored agent, none through runc
        assert not (root / "envs" / env.id / "agent" / "execd.sock").exists()
    finally:
        env.destroy()


SQUAT_C = r"""
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(void) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, "rollstack-execd", 15);
    if (bind(s, (struct sockaddr *)&a, offsetof(struct sockaddr_un, sun_path) + 16) || listen(s, 1)) return 1;
    for (;;) pause();
}
"""


KNOCK_C = r"""
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
int main(void) {  /* what a process of the environment gets from the agent's address */
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, "rollstack-execd", 15);
    if (connect(s, (struct sockaddr *)&a, offsetof(struct sockaddr_un, sun_path) + 16)) { puts("no listener"); return 3; }
    struct timeval tv = {.tv_sec = 10};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    if (read(s, &c, 1) == 0) { puts("closed unserved"); return 0; }
    puts("served");  /* a shim waiting for our request */
    return 2;
}
"""


def _static(tmp_path: Path, name: str, source: str) -> bytes:
    (tmp_path / f"{name}.c").write_text(source)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(tmp_path / name), str(tmp_path / f"{name}.c")], check=True)
    return (tmp_path / name).read_bytes()


def test_the_agent_inside_serves_only_the_node(node, tmp_path: Path) -> None:
    """After a checkpoint the agent's address is reachable from inside the environment: a process
    there that connects is closed unserved (it would otherwise run commands as PID 1)."""
    root, service, client = node
    env = client.create(plan(security={"userns": True}))
    remember(root, env.id)
    try:
        env.write_file("/tmp/knock", _static(tmp_path, "knock", KNOCK_C))
        env.pause("checkpoint")
        env.resume()
        r = env.exec(["/bin/sh", "-c", "chmod +x /tmp/knock && /tmp/knock"], timeout=60)
        assert (r.exit_code, r.stdout) == (0, "closed unserved\n"), r
        assert env.exec(["echo", "the node still is"]).stdout == "the node still is\n"
    finally:
        env.destroy()


def test_a_move_recorded_late_is_found_by_the_next_checkpoint(node, runc_execs) -> None:
    """execd moved its listener but the node never recorded it (its wait timed out): the next
    checkpoint sees the listener inside already instead of waiting for a move that happened."""
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    try:
        handle = service._get(env.id).runtime
        pid = handle._init_pid()
        before = os.readlink(f"/proc/{pid}/fd/3")
        assert teardown.signal_init(handle, signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while os.readlink(f"/proc/{pid}/fd/3") == before:
            assert time.monotonic() < deadline, "execd never moved its listener"
            time.sleep(0.01)
        assert env.pause("checkpoint").pause_mode == "checkpoint"
        env.resume()
        assert env.exec(["echo", "ok"]).stdout == "ok\n" and runc_execs == []
    finally:
        env.destroy()


def test_a_lost_move_signal_is_sent_again(node, runc_execs, monkeypatch) -> None:
    """The first SIGUSR1 is lost (as when it reaches PID 1 while that is still runc's init,
    right after `runc run -d` returned): the checkpoint asks again instead of timing out."""
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    real, sent = teardown.signal_init, []

    def first_lost(handle, sig):
        sent.append(sig)
        return True if len(sent) == 1 else real(handle, sig)

    try:
        monkeypatch.setattr(teardown, "signal_init", first_lost)
        assert env.pause("checkpoint").pause_mode == "checkpoint"
        assert sent[:2] == [signal.SIGUSR1, signal.SIGUSR1]
        env.resume()
        assert env.exec(["echo", "ok"]).stdout == "ok\n" and runc_execs == []
    finally:
        env.destroy()


def test_an_agent_address_taken_inside_leaves_execs_to_runc(node, runc_execs, tmp_path: Path) -> None:
    """A process of the environment holds the agent's address in its network namespace before
    the checkpoint: execd cannot listen there, so execs go through `runc exec`, and still work."""
    root, service, client = node
    squat = _static(tmp_path, "squat", SQUAT_C)
    env = client.create(plan())
    remember(root, env.id)
    try:
        env.write_file("/tmp/squat", squat)
        assert env.exec(["/bin/sh", "-c", "chmod +x /tmp/squat; setsid /tmp/squat </dev/null >/dev/null 2>&1 & "
                         "while ! grep -q '@rollstack-execd' /proc/net/unix; do sleep 0.01; done"],
                        timeout=60).exit_code == 0
        env.pause("checkpoint")
        env.resume()
        assert env.exec(["echo", "via runc"]).stdout == "via runc\n"
        assert env.id in runc_execs
    finally:
        env.destroy()


def test_destroying_a_checkpointed_environment_leaves_nothing(node) -> None:
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    env.exec(["/bin/sh", "-c", COUNTER])
    env.pause("checkpoint")
    env.destroy()
    service.wait_destroyed(60)
    assert not (root / "envs" / env.id).exists() and _processes_of(env.id) == []


def test_what_criu_refuses_leaves_it_running(node) -> None:
    """An exec in flight (its connection and pipes lead to the node): CRIU refuses, the error is
    typed, the environment runs on (its agent now inside it) and can be checkpointed later."""
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    try:
        env.exec(["/bin/sh", "-c", COUNTER])
        result: list = []
        busy = threading.Thread(target=lambda: result.append(env.exec(
            ["/bin/sh", "-c", "touch /tmp/busy; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done"], timeout=120)))
        busy.start()
        deadline = time.monotonic() + 60
        while not env.exec(["/bin/sh", "-c", "test -e /tmp/busy && echo y || true"]).stdout:
            assert time.monotonic() < deadline, "the busy exec never started"
            time.sleep(0.05)
        with pytest.raises(errors.RuntimeFailure):
            env.pause("checkpoint")  # the busy exec is connected to the node all along
        env.write_file("/tmp/go", "")
        busy.join(120)
        assert result and result[0].stdout == "done\n"
        assert env.info().state == "running" and service.stages.provisioner.quotas(env.id)
        _grows(env, _count(env))
        assert env.exec(["echo", "still served"]).stdout == "still served\n"
        assert env.pause("checkpoint").pause_mode == "checkpoint"
        env.resume()
        _grows(env, _count(env))
    finally:
        env.destroy()


def test_bad_modes_and_a_node_without_criu(node, monkeypatch) -> None:
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    try:
        with pytest.raises(errors.InvalidRequest):
            service.pause(env.id, "hibernate")
        monkeypatch.setattr(ckpt, "find_criu", lambda: None)
        with pytest.raises(errors.InvalidRequest, match="CRIU"):
            env.pause("checkpoint")
        assert env.info().state == "running" and env.exec(["true"]).exit_code == 0
    finally:
        env.destroy()


def _crash(service: NodeService) -> None:
    """What an agent crash leaves: no teardown (its reaper and provisioner die with it)."""
    service._stopping.set()
    if service.stages is not None and service.stages.provisioner is not None:
        service.stages.provisioner.stop()
    if service.stages is not None and service.stages.lowers.erofs is not None:
        service.stages.lowers.erofs.wait_idle(60)


@pytest.mark.parametrize("mode", ["checkpoint", "freeze", "cut"])
def test_a_restarted_agent_readopts_a_paused_environment(corpus: str, tmp_path: Path, mode: str) -> None:
    """Checkpointed or frozen, it is adopted paused and resumes; frozen by a fork's cut that the
    crash interrupted (the record not paused), it is thawed at adoption."""
    root = tmp_path / "restart"
    first = NodeService(NodeConfig(root=root, store=corpus))
    first.start()
    env_id = first.create(plan()).id
    remember(root, env_id)
    first.exec(env_id, _req(COUNTER))
    if mode == "cut":
        first._get(env_id).runtime.pause()  # the freezer written, the agent dies before the thaw
    else:
        first.pause(env_id, mode)
    frozen = int(first.read_file(env_id, "/tmp/count").decode())
    _crash(first)
    second = NodeService(NodeConfig(root=root, store=corpus))
    second.start()
    try:
        info = second.info(env_id)
        if mode == "cut":
            assert (info.state, info.pause_mode) == ("running", None)
        else:
            assert (info.state, info.pause_mode) == ("paused", mode)
            second.resume(env_id)
        deadline = time.monotonic() + 30
        while int(second.read_file(env_id, "/tmp/count").decode()) <= frozen:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert second.exec(env_id, _req("echo back")).stdout == "back\n"
    finally:
        second.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def _req(command: str):
    from rollstack.contract.models import ExecRequest

    return ExecRequest(command=command)


@pytest.mark.parametrize("path", ["sync", "api"])
def test_an_exec_let_in_before_a_checkpoint_is_environment_paused(node, monkeypatch, path: str) -> None:
    """The exec passed the paused check, then a checkpoint ended the processes before it ran:
    the caller gets `environment_paused` (retry after resume), not a runtime error."""
    root, service, client = node
    env = client.create(plan())
    remember(root, env.id)
    stages = service.stages
    real_sync, real_async = stages.exec, stages.exec_async

    def late(rec, *args, **kwargs):
        service.pause(env.id, "checkpoint")
        return real_sync(rec, *args, **kwargs)

    async def late_async(rec, request, offload):
        await offload(lambda: service.pause(env.id, "checkpoint"))
        return await real_async(rec, request, offload)

    try:
        monkeypatch.setattr(stages, "exec", late)
        monkeypatch.setattr(stages, "exec_async", late_async)
        with pytest.raises(errors.EnvironmentPaused):
            if path == "sync":
                from rollstack.contract.models import ExecRequest

                service.exec(env.id, ExecRequest(argv=["true"]))
            else:
                env.exec(["true"])
        monkeypatch.undo()
        assert env.info().pause_mode == "checkpoint"
        env.resume()
        assert env.exec(["echo", "ok"]).stdout == "ok\n"
    finally:
        env.destroy()
