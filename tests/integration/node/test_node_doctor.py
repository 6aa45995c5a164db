"""`rollstack node doctor` on real leftovers: a node agent (a real process, in this test's own
root) with a running environment, left by a crash; the doctor lists it, `--fix` reclaims it, a
second run is clean and nothing under the root is mounted. Only the test's own root is ever
given: other tests may run nodes on this machine at the same time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_helpers import plan
from rollstack.host import mountinfo
from rollstack.lazystore import holder
from rollstack.lazystore.config import daemon_pids
from rollstack.node import agent, doctor
from rollstack.node.config import NodeConfig
from rollstack.node.server import free_port

pytestmark = pytest.mark.integration
ROLLSTACK = [sys.executable, "-m", "rollstack.cli.main"]


def cli(*args: str) -> tuple[int, dict]:
    proc = subprocess.run([*ROLLSTACK, *args, "--json"], capture_output=True, text=True, timeout=300)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)  # exactly one JSON document


@pytest.fixture
def node(corpus: str, tmp_path: Path):
    """A node agent process under tmp_path/node with one running environment: (config, env id).
    Whatever the test leaves is reclaimed at the end (the agent stopped first if it still runs)."""
    from rollstack import Client

    config = NodeConfig(root=tmp_path / "node", store=corpus, listen=f"127.0.0.1:{free_port()}")
    started = agent.start(config)
    try:  # no lease: the tests crash the agent, which a renewer would then keep calling
        with Client(config.url(), token=config.token_path.read_text().strip(), lease=None) as client:
            env = client.create(plan())
            assert env.exec("cat hello.txt").exit_code == 0
        yield config, env.id, started["pid"]
    finally:
        if agent.read_pid(config) is not None and agent.root_held(config):
            agent.stop(config)
        _reap(started["pid"])
        found = doctor.scan([config.root])[1]
        if found:
            doctor.fix(found)
        assert not mountinfo.mounts_under(config.root)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)  # the agent is this process's child: no zombie holding its pid
    except ChildProcessError:
        pass


def _crash(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    _reap(pid)


def test_running_agent_is_reported_and_never_reclaimed(node) -> None:
    config, env_id, pid = node
    code, doc = cli("node", "doctor", "--root", str(config.root), "--fix")
    assert code == 1 and not doc["clean"]
    assert [(f["kind"], f["fixable"]) for f in doc["findings"]] == [("agent", False)]
    assert doc["roots"][0]["state"] == "running" and doc["roots"][0]["pid"] == pid
    assert doc["fixed"] == []
    assert (config.root / "envs" / env_id).is_dir()  # untouched
    assert agent.status(config)["running"]
    agent.stop(config)  # a graceful stop leaves nothing the doctor would list
    _reap(pid)
    code, doc = cli("node", "doctor", "--root", str(config.root))
    assert code == 0 and doc["clean"] and doc["findings"] == [], doc["findings"]


def test_crashed_agent_leftovers_listed_then_reclaimed(node) -> None:
    config, env_id, pid = node
    _crash(pid)
    root = str(config.root.resolve())
    code, doc = cli("node", "doctor", "--root", root)
    assert code == 1 and doc["roots"][0]["state"] == "stopped"
    found = {(f["kind"], f["target"]) for f in doc["findings"]}
    kinds = {k for k, _ in found}
    assert {("container", env_id), ("environment", env_id), ("record", f"{env_id}.json"),
            ("file", f"{root}/agent.pid")} <= found
    assert {"daemon", "holder", "mount", "cgroup"} <= kinds, found
    assert (("mount", f"{root}/envs/{env_id}/rootfs") in found)
    assert (("mount", f"{root}/lazy/mnt") in found)
    assert all(f["fixable"] and f["root"] == root for f in doc["findings"])

    code, fixed = cli("node", "doctor", "--root", root, "--fix")
    assert code == 0 and fixed["clean"] and fixed["remaining"] == [], fixed
    assert fixed["fixed"] and all(x["ok"] for x in fixed["fixed"])
    assert not mountinfo.mounts_under(config.root)
    assert not daemon_pids(config.lazy_dir / "mnt") and not holder.pids(config.lazy_dir / "state")
    assert not (config.root / "envs" / env_id).exists()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/rollstack/{env_id}"))

    code, again = cli("node", "doctor", "--root", root, "--fix")  # idempotent
    assert code == 0 and again["clean"] and again["findings"] == [] and again["fixed"] == []


def test_dead_daemon_fuse_connection_is_aborted(node) -> None:
    """Agent and lazy store daemon killed: the fd-holder keeps the FUSE connection with no
    daemon behind it (a read would wait); the doctor aborts it and reclaims the rest."""
    config, env_id, pid = node
    daemons = daemon_pids(config.lazy_dir / "mnt")
    assert daemons
    _crash(pid)
    for d in daemons:
        os.kill(d, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while daemon_pids(config.lazy_dir / "mnt") and time.monotonic() < deadline:
        time.sleep(0.05)
    root = str(config.root.resolve())
    t = time.monotonic()
    facts, found = doctor.scan([root])
    assert time.monotonic() - t < doctor.SCAN_TIMEOUT
    assert ("fuse", f"{root}/lazy/mnt") in {(f.kind, f.target) for f in found}, found
    results, remaining = doctor.fix(found)
    assert remaining == [], remaining
    assert all(r.ok for r in results), results
    assert not mountinfo.mounts_under(config.root)
    assert not holder.pids(config.lazy_dir / "state")
    assert doctor.scan([root])[1] == []
