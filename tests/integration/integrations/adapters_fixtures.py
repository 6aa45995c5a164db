"""Helpers of the adapter integration tests: a busybox corpus (os/busybox:1, repo/app:1) and a
plan over it (a mutation, an exit-code evaluator), plus two SWE-smith-style tasks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

BUSYBOX = Path("/bin/busybox")
TOKEN = "adapters-token"
BUG_HELLO = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+bug\n"
FIX_HELLO = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-bug\n+hello\n"
BUG_COLOR = "--- a/color.txt\n+++ b/color.txt\n@@ -1,2 +1,2 @@\n-red\n+rde\n green\n"
FIX_COLOR = "--- a/color.txt\n+++ b/color.txt\n@@ -1,2 +1,2 @@\n-rde\n+red\n green\n"


def _applets() -> list[str]:
    out = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout
    return [a for a in out.split() if a and "/" not in a and a != "busybox"]


def build_trees(work: Path) -> dict[str, Path]:
    os_root = work / "os"
    (os_root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, os_root / "bin" / "busybox")
    for applet in _applets():
        os.symlink("busybox", os_root / "bin" / applet)
    for d in ("tmp", "etc", "proc", "dev", "sys", "root", "work", "usr/bin"):
        (os_root / d).mkdir(parents=True, exist_ok=True)
    (os_root / "tmp").chmod(0o1777)
    (os_root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    repo = work / "repo" / "work" / "app"
    repo.mkdir(parents=True)
    (repo / "hello.txt").write_text("hello\n")
    (repo / "color.txt").write_text("red\ngreen\n")
    return {"os": os_root, "repo": work / "repo"}


def busybox_plan(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "hello-task",
        "groups": ["os/busybox:1", "repo/app:1"],
        "mutation_text": BUG_HELLO,
        "workdir": "/work/app",
        "env": {"TASK": "hello"},
        "resources": {"cpu": 0.5, "memory": "128Mi", "max_cpu": 1, "max_memory": "256Mi"},
        "timeout": 300,
        "fetch": {"background": False},
        "evaluator": {"groups": ["os/busybox:1", "repo/app:1"], "command": ["/bin/sh", "-c", "grep -qx hello hello.txt"]},
    }
    doc.update(overrides)
    return doc


def swe_tasks() -> list[dict[str, Any]]:
    """Two tasks in the SWE-smith schema over repo/app (their test commands are grep checks)."""
    return [
        {"instance_id": "app.1.hello__0", "repo": "app", "version": "1", "workdir": "/work/app",
         "patch": BUG_HELLO, "fix": FIX_HELLO, "FAIL_TO_PASS": ["hello.txt::hello"], "PASS_TO_PASS": [],
         "test_command": "grep -qx hello hello.txt"},
        {"instance_id": "app.1.color__1", "repo": "app", "version": "1", "workdir": "/work/app",
         "patch": BUG_COLOR, "fix": FIX_COLOR, "FAIL_TO_PASS": ["color.txt::red"], "PASS_TO_PASS": [],
         "test_command": "grep -qx red color.txt && grep -qx green color.txt"},
    ]


BUSYBOX_TEMPLATE = """\
# plan template for the busybox tasks: {repo}/{version} come from each task
groups: [os/busybox:1, "repo/{repo}:{version}"]
workdir: "{workdir}"
resources: {cpu: 0.5, memory: 128Mi, max_cpu: 1, max_memory: 256Mi}
fetch: {background: false}
timeout: 300
evaluator:
  groups: [os/busybox:1, "repo/{repo}:{version}"]
  command: 'eval "$RS_TEST_COMMAND"'   # runs in the plan's workdir
"""
