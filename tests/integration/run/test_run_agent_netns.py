"""`NetnsAgent`: reaching the exec agent inside an environment's network namespace (after a
checkpoint), as root: the socket is made in the namespace of the given PID 1, and a listener
that is not that process is refused (`AgentUnavailable`, so the exec goes through runc)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from rollstack.run import agent

pytestmark = pytest.mark.integration
FLAGS = socket.SOCK_STREAM | socket.SOCK_CLOEXEC
OURS = open("/proc/self/cgroup").read().splitlines()[-1].split(":", 2)[2]
"""This process's cgroup (as a line of /proc/PID/cgroup ends), which the test's children share."""
LISTEN = ("import socket, time; s = socket.socket(socket.AF_UNIX); s.bind(b'\\0rollstack-execd'); "
          "s.listen(4); print('ready', flush=True); time.sleep(600)")


@pytest.fixture
def listener():
    """A process in a network namespace of its own, listening at the agent's address there (the
    host's namespace is left alone)."""
    proc = subprocess.Popen(["unshare", "--net", sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _pump(address: agent.AgentAddress) -> agent.AgentPump:
    return agent.AgentPump(address, ["true"], None, None, None, 10.0, 1024, None, 0.2, "test")


def test_the_socket_is_made_in_the_namespace_of_the_pid_and_its_listener_is_accepted(listener) -> None:
    inside = agent.NetnsAgent(listener.pid, OURS)
    conn = inside.socket(FLAGS)
    try:
        conn.connect(agent.NETNS_ADDRESS)  # nobody listens there in the host's namespace
        inside.check_peer(conn)
    finally:
        conn.close()
    _pump(inside)._connect().close()


def test_a_listener_of_another_process_is_refused(listener) -> None:
    other = subprocess.Popen(["nsenter", f"--net=/proc/{listener.pid}/ns/net", "sleep", "60"])  # same namespace
    try:
        deadline = time.monotonic() + 30
        while os.readlink(f"/proc/{other.pid}/ns/net") != os.readlink(f"/proc/{listener.pid}/ns/net"):
            assert time.monotonic() < deadline, "nsenter never joined the namespace"
            time.sleep(0.01)
        with pytest.raises(agent.AgentUnavailable, match=f"held by pid {listener.pid}"):
            _pump(agent.NetnsAgent(other.pid, OURS))._connect()
    finally:
        other.kill()
        other.wait()


def test_a_gone_pid_or_nobody_listening_is_unavailable() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(agent.AgentUnavailable, match="no process"):
        _pump(agent.NetnsAgent(gone.pid, OURS))._connect()
    with pytest.raises(agent.AgentUnavailable):  # nobody at the address in the host's namespace
        _pump(agent.NetnsAgent(os.getpid(), OURS))._connect()


def test_no_thread_to_be_had_is_unavailable(listener, monkeypatch) -> None:
    def refuse(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(agent.threading.Thread, "start", refuse)
    with pytest.raises(agent.AgentUnavailable, match="no thread"):
        _pump(agent.NetnsAgent(listener.pid, OURS))._connect()


def test_a_pid_outside_the_environments_cgroup_is_not_its_init(listener) -> None:
    with pytest.raises(agent.AgentUnavailable, match="not the environment's init"):
        _pump(agent.NetnsAgent(listener.pid, "/rollstack/not-this-one"))._connect()
