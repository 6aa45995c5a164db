"""A restarted agent waits for a killed predecessor's root lock only while that predecessor is
dying (its main thread a zombie, the lock still held by an exiting part of it); a live holder
is another agent, refused at once (found by `bench chaos`: a restart right after a SIGKILL met
RootInUse and left the node down)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from rollstack.node.agent import root_held, wait_root_released
from rollstack.node.config import NodeConfig

# The holder: takes the lock, names itself in agent.json, forks a child that keeps the lock's
# file open for `linger` s after the holder itself exits (as a dying agent's last threads do).
HOLDER = textwrap.dedent("""
    import fcntl, json, os, sys, time
    root, linger, stay = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "stay"
    f = open(os.path.join(root, "agent.lock"), "a+")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    json.dump({"pid": os.getpid()}, open(os.path.join(root, "agent.json"), "w"))
    print("held", flush=True)
    if stay:
        time.sleep(60)
    if os.fork() == 0:
        time.sleep(linger)
        os._exit(0)
    os._exit(0)
""")


def _hold(root: Path, linger: float, stay: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), str(linger), "stay" if stay else "go"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_dying_holders_lock_is_waited_for(tmp_path: Path) -> None:
    cfg = NodeConfig(root=tmp_path)
    proc = _hold(tmp_path, linger=3, stay=False)
    deadline = time.monotonic() + 60  # the holder exits (a zombie: we do not reap it yet) ...
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert root_held(cfg)  # ... while its child holds the lock on (for 3 s)
    assert wait_root_released(cfg, timeout=60)
    assert not root_held(cfg)
    proc.wait()


def test_a_live_holder_is_refused_at_once(tmp_path: Path) -> None:
    cfg = NodeConfig(root=tmp_path)
    proc = _hold(tmp_path, linger=0, stay=True)
    try:
        assert json.loads((tmp_path / "agent.json").read_text())["pid"] == proc.pid
        assert wait_root_released(cfg, timeout=60) is False
        assert root_held(cfg)
    finally:
        proc.kill()
        proc.wait()
