"""The in-sandbox exec agent (rollstack-execd as PID 1): same sandbox as runc exec, and failures.

Bad input: a shim killed mid-exec, a socket that is gone, an output flood, a fork bomb, a
consumer that goes away mid-stream, many create/exec/destroy cycles (nothing of ours leaks).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from proc_helpers import assert_tree_gone, kill_exec_shim

from rollstack.errors import EnvironmentGone, RuntimeFailure
from rollstack.run import agent
from rollstack.run.environment import EnvironmentRuntime, RuntimeConfig
from rollstack.run.ocispec import SpecParams

pytestmark = [pytest.mark.integration,  # the agent driven from a thread and from an event loop
              pytest.mark.parametrize("exec_mode", ["agent", "agent-async"], indirect=True)]

SANDBOX_PROBE = ("grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Seccomp_filters):' "
                 "/proc/self/status; cat /proc/self/cgroup | sort; readlink /proc/self/ns/pid "
                 "/proc/self/ns/net /proc/self/ns/mnt /proc/self/ns/ipc /proc/self/ns/uts; "
                 "ulimit -n; cat /proc/self/oom_score_adj; id -u; hostname; env | grep -v ^SHLVL= | sort")


def test_pid1_is_execd_and_commands_do_not_start_runc(make_env, runtime):
    env = make_env()
    assert runtime.uses_agent
    assert agent.socket_path(env.dir).is_socket()
    assert oct(agent.socket_path(env.dir).parent.stat().st_mode & 0o777) == "0o700"
    assert os.path.samefile(f"/proc/{env._init_pid()}/exe", runtime.init.init)
    assert Path(runtime.init.init).name == "rollstack-execd"
    # the socket is host-side only: nothing under the container's root names it
    assert env.exec("ls -a /.rollstack").stdout.split() == [b".", b"..", b"busybox", b"init",
                                                              b"tini"]
    assert env.exec("echo hi").stdout == b"hi\n"


def test_agent_and_runc_give_the_same_sandbox(runtime, busybox_lower, tmp_path):
    """Caps, no_new_privs, seccomp, cgroup, namespaces, rlimits, env: equal on both paths."""
    env_id = f"t-{uuid.uuid4().hex[:12]}"
    env = runtime.create(env_id, [busybox_lower], SpecParams(env_id, env={"FROM": "spec"},
                                                             cpu=0.5, memory=256 << 20))
    try:
        via_agent = env.exec(SANDBOX_PROBE, env={"EXTRA": "1"})
        runc_rt = EnvironmentRuntime(RuntimeConfig(root=runtime.root, exec_agent=False,
                                                   subreaper=False))
        via_runc = runc_rt.open(env_id).exec(SANDBOX_PROBE, env={"EXTRA": "1"})
        assert via_agent.exit_code == via_runc.exit_code == 0, (via_agent, via_runc)
        assert b"NoNewPrivs:\t1" in via_agent.stdout and b"Seccomp:\t2" in via_agent.stdout
        assert b"EXTRA=1" in via_agent.stdout and b"FROM=spec" in via_agent.stdout
        # the one documented difference: runc exec's tini wrapper runs with its warnings muted
        # (docs/runtime.md), and its variable is visible to the command
        runc_lines = [ln for ln in via_runc.stdout.split(b"\n") if ln != b"TINI_VERBOSITY=0"]
        assert via_agent.stdout.split(b"\n") == runc_lines
        assert b"TINI_VERBOSITY=0" in via_runc.stdout
    finally:
        env.destroy()


def test_socket_gone_falls_back_to_runc(make_env):
    env = make_env()
    agent.socket_path(env.dir).unlink()
    r = env.exec("echo $$; cat /proc/1/cmdline")
    assert r.exit_code == 0 and b"/.rollstack/init" in r.stdout


def test_killed_shim_is_a_runtime_failure_and_the_env_stays_usable(make_env):
    env = make_env()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            env.exec("sleep 300")
        except BaseException as e:  # noqa: BLE001 - inspected below
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    kill_exec_shim(env._init_pid())
    th.join(10)
    assert not th.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeFailure), errors
    assert "shim died" in str(errors[0])
    assert env.exec("echo still here").stdout == b"still here\n"


def test_exec_into_a_dead_environment_is_gone(make_env, wait_stopped):
    env = make_env()
    os.kill(env._init_pid(), 9)  # PID 1 (the agent) dies: the container ends
    wait_stopped(env)
    with pytest.raises(EnvironmentGone):
        env.exec("true")


def test_output_flood_is_capped_and_the_command_is_not_blocked(make_env):
    env = make_env()
    start = time.monotonic()
    r = env.exec("head -c 200000000 /dev/zero; echo done >&2", output_limit=1 << 20, timeout=60)
    assert r.truncated and len(r.stdout) == 1 << 20 and r.stderr == b"done\n"
    assert r.exit_code == 0 and not r.timed_out
    assert time.monotonic() - start < 60


def test_fork_bomb_hits_the_pids_limit_and_timeout_ends_it(make_env):
    env = make_env(pids_limit=64)
    r = env.exec("(b() { b | b & }; b); sleep 30", timeout=3)
    assert r.timed_out and r.exit_code == 124
    time.sleep(0.2)
    ps = env.exec(["ps", "-o", "args"]).stdout.decode().splitlines()[1:]
    assert [line for line in ps if "sh" in line and "ps" not in line] == [], ps
    assert env.exec("echo ok").stdout == b"ok\n"


def test_consumer_gone_mid_stream_kills_the_tree(make_env):
    env = make_env()

    def explode(stream: str, chunk: bytes) -> None:
        raise RuntimeError("client disconnected")

    with pytest.raises(RuntimeError):
        env.exec("echo first; sleep 301 & sleep 300", on_output=explode)
    assert_tree_gone(env, b"sleep 300", b"sleep 301")


def test_many_concurrent_execs(make_env):
    env = make_env()
    results: list[bytes] = []

    def run(i: int) -> None:
        results.append(env.exec(["echo", str(i)]).stdout)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == sorted(f"{i}\n".encode() for i in range(64))


def test_create_exec_destroy_cycles_leave_nothing(runtime, busybox_lower):
    """Bounded leak check: only what this runtime created (its root, its ids) is looked at."""
    ids = []
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(40):
        env_id = f"leak-{uuid.uuid4().hex[:10]}"
        ids.append(env_id)
        env = runtime.create(env_id, [busybox_lower], SpecParams(env_id))
        assert env.exec("sleep 100 & echo x").stdout == b"x\n"
        env.exec("sleep 100", timeout=0.2)
        env.destroy()
    left = runtime.find_leftovers()
    assert left.empty(), left
    assert not list((runtime.root / "envs").iterdir())
    mounts = Path("/proc/self/mountinfo").read_text()
    assert not [i for i in ids if i in mounts]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert not any(i.encode() in cmd for i in ids), cmd
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2  # no socket or pipe of ours leaked


def test_a_kill_that_came_before_the_request_was_read_starts_nothing(make_env, monkeypatch):
    """The node's 'K' (a timeout, a kill) is already waiting when the shim has read the request
    (a shim slowed down by a busy node): the command never runs, the exec ends as killed."""
    env = make_env()
    real = agent.encode_request
    # the 'K' right behind the request, in the same write: there when the shim has read it
    monkeypatch.setattr(agent, "encode_request", lambda *a: real(*a) + b"K")
    r = env.exec("touch /tmp/ran")
    assert r.exit_code == agent.exit_code(9) and not r.timed_out, r
    monkeypatch.undo()
    assert env.exec("test -e /tmp/ran").exit_code == 1  # never started
    assert env.exec("echo still here").stdout == b"still here\n"
