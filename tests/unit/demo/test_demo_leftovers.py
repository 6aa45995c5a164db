"""The demo's leftover count (rollstack_demo.runner.find_leftovers): a child process rooted in
another node's environment is that node's; one of this node's, or rooted nowhere known, counts."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rollstack_demo.runner import _other_nodes, child_processes, find_leftovers


def _rooted_child(root: Path) -> int:
    """A child process chrooted into `root` (it sleeps until killed)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.chroot(root)
            time.sleep(60)
        finally:
            os._exit(0)
    end = time.monotonic() + 30
    while os.readlink(f"/proc/{pid}/root") != str(root) and time.monotonic() < end:
        time.sleep(0.01)
    return pid


def test_a_child_in_another_nodes_environment_is_not_this_nodes_leftover(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    rootfs = other / "envs" / "e123" / "rootfs"
    rootfs.mkdir(parents=True)
    (mine / "envs").mkdir(parents=True)
    before = set(child_processes())
    pid = _rooted_child(rootfs)
    try:
        assert _other_nodes(pid, mine) and not _other_nodes(pid, other)
        assert not _other_nodes(os.getpid(), mine)  # rooted at /: counts
        assert find_leftovers(mine, set(), ignore_children=before)["processes"] == []
        assert find_leftovers(other, set(), ignore_children=before)["processes"] == [f"{pid} {_comm(pid)}"]
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()
