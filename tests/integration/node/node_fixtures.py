"""Shared helpers of the node integration tests: a tiny busybox corpus published to an OCI
layout store, and a node (NodeService + uvicorn on a loopback port) over it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "echo", "true", "false", "mkdir", "rm", "sleep", "ps", "wc", "test",
           "env", "pwd", "ln", "head", "kill", "grep", "dd", "printf", "touch", "id", "ip", "yes")
HELLO_MUTATION = """--- a/hello.txt
+++ b/hello.txt
@@ -1 +1 @@
-hello
+bug
"""
CHECK_SH = """#!/bin/sh
# the evaluator's test: passes iff the task's bug is fixed
grep -q '^fixed$' /work/app/hello.txt && echo PASS && exit 0
echo FAIL; exit 1
"""


def _tree(root: Path, files: dict[str, str], mode: int = 0o644) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)
    return root


def build_corpus(work: Path) -> dict[str, Path]:
    """Three groups' source trees: os/busybox, repo/app, evaluator/app."""
    os_root = work / "os"
    (os_root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, os_root / "bin" / "busybox")
    for applet in APPLETS:
        os.symlink("busybox", os_root / "bin" / applet)
    for d in ("tmp", "etc", "proc", "dev", "sys", "root", "work", "usr/bin"):
        (os_root / d).mkdir(parents=True, exist_ok=True)
    (os_root / "tmp").chmod(0o1777)
    (os_root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    repo = _tree(work / "repo", {"work/app/hello.txt": "hello\n", "work/app/README": "a tiny repo\n"})
    ev = _tree(work / "eval", {"eval/check.sh": CHECK_SH}, mode=0o755)
    return {"os": os_root, "repo": repo, "eval": ev}


def publish_corpus(store_dir: Path, work: Path) -> str:
    """Publish the corpus into an OCI layout at `store_dir`; returns the store spec."""
    from rollstack.plan.groups import publish_group
    from rollstack.store import open_store

    trees = build_corpus(work)
    spec = f"oci:{store_dir}"
    store = open_store(spec)
    try:
        publish_group(store, "os/busybox:1", [trees["os"]], work_dir=work)
        publish_group(store, "repo/app:1", [trees["repo"]], work_dir=work)
        publish_group(store, "evaluator/app:1", [trees["eval"]], work_dir=work)
    finally:
        close = getattr(store, "close", None)
        if close:
            close()
    return spec


def plan(**overrides) -> dict:
    doc = {
        "name": "app-task",
        "groups": ["os/busybox:1", "repo/app:1"],
        "mutation_text": HELLO_MUTATION,
        "workdir": "/work/app",
        "env": {"TASK": "app"},
        "resources": {"cpu": 0.5, "memory": "128Mi", "max_cpu": 2, "max_memory": "512Mi"},
        "timeout": 600,
        "fetch": {"background": False},
        "evaluator": {
            "groups": ["os/busybox:1", "repo/app:1", "evaluator/app:1"],
            "command": ["/bin/sh", "/eval/check.sh"],
        },
    }
    doc.update(overrides)
    return doc


def leftovers(root: Path) -> dict[str, list[str]]:
    """Everything a node could leave behind under `root`: mounts, env dirs, runc state, cgroups."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split(" ")[4]
            if mp.startswith(str(root / "envs")):
                mounts.append(mp)
    envs = sorted(p.name for p in (root / "envs").iterdir()) if (root / "envs").is_dir() else []
    runc = sorted(p.name for p in (root / "runc").iterdir() if p.is_dir() and not p.name.startswith("rs-exec-")) \
        if (root / "runc").is_dir() else []
    cgroups = []
    for hier in Path("/sys/fs/cgroup").iterdir():
        parent = hier / "rollstack"
        if parent.is_dir():
            cgroups += [str(p) for p in parent.iterdir() if p.is_dir() and p.name in _known_ids(root)]
    return {"mounts": mounts, "envs": envs, "runc": runc, "cgroups": cgroups}


_IDS: dict[str, set[str]] = {}


def remember(root: Path, env_id: str) -> None:
    _IDS.setdefault(str(root), set()).add(env_id)


def _known_ids(root: Path) -> set[str]:
    return _IDS.get(str(root), set())
