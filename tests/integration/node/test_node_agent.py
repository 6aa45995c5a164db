"""`rollstack node start|status|stop` as a user runs them: a daemonized agent, the CLI against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components import need, require_tool
from node_helpers import leftovers, plan, publish_corpus
from rollstack.node.server import free_port

pytestmark = pytest.mark.integration
ROLLSTACK = [sys.executable, "-m", "rollstack.cli.main"]


def cli(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*ROLLSTACK, *args], capture_output=True, text=True, env=env, timeout=180)
    if check and proc.returncode != 0:
        raise AssertionError(f"rollstack {' '.join(args)} -> {proc.returncode}: {proc.stderr}")
    return proc


def test_start_status_cli_stop(tmp_path: Path) -> None:
    require_tool("runc")
    need(Path("/bin/busybox").exists(), "busybox-static (/bin/busybox)")
    store = publish_corpus(tmp_path / "store", tmp_path / "build")
    root = tmp_path / "node"
    port = free_port()
    started = json.loads(cli("node", "start", "--root", str(root), "--listen", f"127.0.0.1:{port}",
                             "--store", store, "--json").stdout)
    try:
        token_file = root / "token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        status = json.loads(cli("node", "status", "--root", str(root), "--json").stdout)
        assert status["running"] and status["pid"] == started["pid"]

        env = {**os.environ, "ROLLSTACK_NODE": f"http://127.0.0.1:{port}", "ROLLSTACK_ROOT": str(root)}
        env.pop("ROLLSTACK_TOKEN", None)  # the token comes from the node's root
        plan_file = tmp_path / "plan.yaml"
        (tmp_path / "task.diff").write_text("--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+bug\n")
        doc = plan()
        doc.pop("mutation_text")
        doc["mutation"] = "task.diff"
        plan_file.write_text(json.dumps(doc))  # JSON is YAML
        created = json.loads(cli("env", "create", str(plan_file), "--json", env=env).stdout)
        env_id = created["id"]
        proc = cli("env", "exec", env_id, "--", "sh", "-c", "cat hello.txt; exit 4", env=env, check=False)
        assert (proc.returncode, proc.stdout) == (4, "bug\n")
        src = tmp_path / "fix.txt"
        src.write_text("fixed\n")
        cli("env", "cp", str(src), f"{env_id}:/work/app/hello.txt", env=env)
        assert "+fixed" in cli("env", "diff", env_id, env=env).stdout
        assert json.loads(cli("env", "evaluate", env_id, "--json", env=env).stdout)["reward"] == 1.0
        listed = json.loads(cli("env", "ls", "--json", env=env).stdout)["environments"]
        assert [e["id"] for e in listed] == [env_id]
        proc = cli("run", str(plan_file), "--", "cat", "hello.txt", env=env, check=False)
        assert (proc.returncode, proc.stdout) == (0, "bug\n")
        bad = cli("env", "ls", "--token", "wrong", env=env, check=False)
        assert bad.returncode == 1 and bad.stderr.startswith("error: unauthorized:")
        cli("volume", "create", "cli-vol", env=env)
        cli("volume", "put", "cli-vol", str(src), "/in/fix.txt", env=env)
        assert cli("volume", "get", "cli-vol", "/in/fix.txt", env=env).stdout == "fixed\n"
        vols = json.loads(cli("volume", "ls", "--json", env=env).stdout)["volumes"]
        assert [(v["name"], v["mounted_by"]) for v in vols] == [("cli-vol", [])]
        busy = cli("volume", "create", "cli-vol", env=env, check=False)
        assert busy.returncode == 1 and busy.stderr.startswith("error: already_exists:")
        cli("volume", "rm", "cli-vol", env=env)
        assert json.loads(cli("volume", "ls", "--json", env=env).stdout)["volumes"] == []
        # env_id is left alive on purpose: a graceful stop must destroy it
    finally:
        stopped = json.loads(cli("node", "stop", "--root", str(root), "--json").stdout)
    assert stopped["stopped"]
    assert cli("node", "status", "--root", str(root), check=False).returncode == 1
    left = leftovers(root)
    assert not left["mounts"] and not left["envs"] and not left["runc"], left
    assert not (root / "lazy" / "mnt" / "layers").exists()  # the lazy store is unmounted too
