"""`NetnsAgent`: reaching the exec agent inside an environment's network namespace (after a
checkpoint), as root: the socket is made in the namespace of the given PID 1, and a listener
that is not that process is refused (`AgentUnavailable`, so the exec goes through runc)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from rollstack.run import agent

pytestmark = pytest.mark.integration
FLAGS = socket.SOCK_STREAM | socket.SOCK_CLOEXEC
OURS = open("/proc/self/cgroup").read().splitlines()[-1].split(":", 2)[2]
"""This process's cgroup (as a line of /proc/PID/cgroup ends), which the test's children share."""


@pytest.fixture
def listener():
    """A listener at the agent's address in this (the host's) network namespace, held by us."""
    sock = socket.socket(socket.AF_UNIX, FLAGS)
    sock.bind(agent.NETNS_ADDRESS)
    sock.listen(4)
    yield sock
    sock.close()


def _pump(address: agent.AgentAddress) -> agent.AgentPump:
    return agent.AgentPump(address, ["true"], None, None, None, 10.0, 1024, None, 0.2, "test")


def test_the_socket_is_made_in_the_namespace_of_the_pid_and_its_listener_is_accepted(listener) -> None:
    ours = agent.NetnsAgent(os.getpid(), OURS)
    conn = ours.socket(FLAGS)
    try:
        conn.connect(agent.NETNS_ADDRESS)
        ours.check_peer(conn)  # the listener is this process's
    finally:
        conn.close()
    _pump(ours)._connect().close()


def test_a_listener_of_another_process_is_refused(listener) -> None:
    other = subprocess.Popen(["sleep", "60"])  # same namespace, not the listener's owner
    try:
        with pytest.raises(agent.AgentUnavailable, match=f"held by pid {os.getpid()}"):
            _pump(agent.NetnsAgent(other.pid, OURS))._connect()
    finally:
        other.kill()
        other.wait()


def test_a_gone_pid_or_nobody_listening_is_unavailable() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(agent.AgentUnavailable, match="no process"):
        _pump(agent.NetnsAgent(gone.pid, OURS))._connect()
    with pytest.raises(agent.AgentUnavailable):  # nobody at the address in our namespace
        _pump(agent.NetnsAgent(os.getpid(), OURS))._connect()


def test_no_thread_to_be_had_is_unavailable(listener, monkeypatch) -> None:
    def refuse(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(agent.threading.Thread, "start", refuse)
    with pytest.raises(agent.AgentUnavailable, match="no thread"):
        _pump(agent.NetnsAgent(os.getpid(), OURS))._connect()


def test_a_pid_outside_the_environments_cgroup_is_not_its_init(listener) -> None:
    with pytest.raises(agent.AgentUnavailable, match="not the environment's init"):
        _pump(agent.NetnsAgent(os.getpid(), "/rollstack/not-this-one"))._connect()
