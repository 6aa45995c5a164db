"""One agent per root: a second `node start` on a root a live agent holds refuses, naming it
(before the lock, it started duplicates that aborted each other's FUSE connection)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node_helpers import plan, publish_corpus
from rollstack.node.server import free_port

pytestmark = pytest.mark.integration
ROLLSTACK = [sys.executable, "-m", "rollstack.cli.main"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ROLLSTACK, *args], capture_output=True, text=True, timeout=180)


def test_second_start_on_a_held_root_refuses_naming_the_agent(tmp_path: Path) -> None:
    from rollstack import Client

    store = publish_corpus(tmp_path / "store", tmp_path / "build")
    root = tmp_path / "node"
    port = free_port()
    first = cli("node", "start", "--root", str(root), "--listen", f"127.0.0.1:{port}", "--store", store, "--json")
    assert first.returncode == 0, first.stderr
    pid = json.loads(first.stdout)["pid"]
    try:
        for _ in range(2):  # another port, same root: refused, and the first agent is untouched
            other = cli("node", "start", "--root", str(root), "--listen", f"127.0.0.1:{free_port()}", "--store", store)
            assert other.returncode == 1
            assert other.stderr.startswith(f"error: root_in_use: root {root} is held by node agent pid {pid} "
                                           f"serving http://127.0.0.1:{port}"), other.stderr
        same = cli("node", "start", "--root", str(root), "--listen", f"127.0.0.1:{port}", "--store", store, "--json")
        assert same.returncode == 0 and json.loads(same.stdout)["already_running"]
        token = (root / "token").read_text().strip()
        with Client(f"http://127.0.0.1:{port}", token=token) as c:
            with c.create(plan()) as env:
                assert env.exec("cat hello.txt").stdout == "bug\n"
        # the agent process itself refuses too (a race past the CLI's check)
        from rollstack.node.config import NodeConfig

        cfg = NodeConfig(root=root, store=store, listen=f"127.0.0.1:{free_port()}")
        proc = subprocess.run([sys.executable, "-m", "rollstack.node.agent", "serve", cfg.model_dump_json()],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3 and f"error: root_in_use: root {root} is held by node agent pid {pid}" in proc.stderr
    finally:
        stop = cli("node", "stop", "--root", str(root), "--json")
        assert stop.returncode == 0 and json.loads(stop.stdout)["stopped"], stop.stderr
