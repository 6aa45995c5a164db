"""`rollstack bench packaging`: layer groups vs one image per (task, harness), side by side.

Synthetic components (an OS base, B repository bases, H harnesses, an evaluator; T tasks, each a
small source change) are published two ways into two fresh OCI layout stores:
- static bundling: T x H images; each is the OS + repo layers plus a top layer holding the task's
  changed files and the harness installed on top (as a Dockerfile would bake them);
- layer groups: B + 2 + H groups; a task is a plan whose mutation (a diff) is applied at init.
Then one harness changes (one file) and each side republishes what it must. Reported: artifacts,
stored bytes, publish time, and the harness update's uploaded bytes and time.
"""

from __future__ import annotations

import difflib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer


def _tree(root: Path, files: int, size: int, seed: str) -> Path:
    rng = random.Random(seed)
    for i in range(files):
        p = root / f"d{i % 10}" / f"f{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        words = [f"value_{rng.randrange(10**6)} = {rng.randrange(10**6)}\n" for _ in range(max(1, size // 24))]
        p.write_text("".join(words))
    return root


def _task_change(repo: Path, t: int) -> dict[str, tuple[str, str]]:
    """The files a task changes: {relative path: (before, after)}."""
    rng = random.Random(f"task-{t}")
    files = sorted(p for p in repo.rglob("*.py"))
    out = {}
    for p in rng.sample(files, 2):
        before = p.read_text()
        lines = before.splitlines(keepends=True)
        i = rng.randrange(len(lines))
        lines[i] = lines[i].replace("=", "!=", 1)
        out[str(p.relative_to(repo))] = (before, "".join(lines))
    return out


def _diff(change: dict[str, tuple[str, str]]) -> str:
    return "".join("".join(difflib.unified_diff(b.splitlines(True), a.splitlines(True), f"a/{p}", f"b/{p}"))
                   for p, (b, a) in change.items())


def _stored_bytes(store_root: Path) -> int:
    return sum(p.stat().st_size for p in (store_root / "blobs").rglob("*") if p.is_file())


def run(repos: int, tasks_per_repo: int, harnesses: int, work: Path, command: str) -> dict[str, Any]:
    from rollstack.plan.groups import convert_sources, list_groups, publish_group, publish_layers, summarize
    from rollstack.store.ocilayout import OciLayoutStore

    src = work / "src"
    os_tree = _tree(src / "os", 600, 4000, "os")
    evaluator = _tree(src / "evaluator", 20, 2000, "eval")
    repo_trees = [_tree(src / f"repo{b}", 200, 3000, f"repo{b}") for b in range(repos)]
    harness_trees = [_tree(src / f"harness{h}", 150, 3000, f"harness{h}") for h in range(harnesses)]
    tasks = [(b, t, _task_change(repo_trees[b], b * 1000 + t)) for b in range(repos) for t in range(tasks_per_repo)]

    def static_top(b: int, t: int, change: dict, h: int) -> Path:
        top = work / "tops" / f"r{b}-t{t}-h{h}"
        shutil.rmtree(top, ignore_errors=True)
        shutil.copytree(harness_trees[h], top / "opt/harness")
        for rel, (_, after) in change.items():
            (top / "work" / rel).parent.mkdir(parents=True, exist_ok=True)
            (top / "work" / rel).write_text(after)
        return top

    # -- static bundling: T x H images ----------------------------------------------------------
    # Fair to images: the OS and repo layers are built once and reused (a build cache), only
    # each image's own top layer (task change + harness) is built per image.
    static_store = OciLayoutStore(work / "static-store")
    start = time.perf_counter()
    shared = convert_sources([os_tree, *repo_trees], work / "shared-layers")

    def publish_image(b: int, t: int, change: dict, h: int, created: str) -> int:
        top = convert_sources([static_top(b, t, change, h)], work / "top-layer")
        r = publish_layers(static_store, f"image/r{b}-t{t}-h{h}", "1", [shared[0], shared[1 + b], *top],
                           kind="image", created=created)
        return r.uploaded_bytes

    for b, t, change in tasks:
        for h in range(harnesses):
            publish_image(b, t, change, h, "2026-01-01T00:00:00Z")
    static_publish = time.perf_counter() - start
    static_summary = summarize(list_groups(static_store))

    # -- layer groups: B + 2 + H -------------------------------------------------------------
    group_store = OciLayoutStore(work / "group-store")
    start = time.perf_counter()
    publish_group(group_store, "os/base:1", [os_tree], created="2026-01-01T00:00:00Z")
    publish_group(group_store, "evaluator/tests:1", [evaluator], created="2026-01-01T00:00:00Z")
    for b in range(repos):
        publish_group(group_store, f"repo/r{b}:1", [repo_trees[b]], created="2026-01-01T00:00:00Z")
    for h in range(harnesses):
        publish_group(group_store, f"harness/h{h}:1", [harness_trees[h]], created="2026-01-01T00:00:00Z")
    group_publish = time.perf_counter() - start
    group_summary = summarize(list_groups(group_store))
    diff_bytes = sum(len(_diff(change)) for _, _, change in tasks)

    # -- one harness changes ------------------------------------------------------------------
    (harness_trees[0] / "d0" / "f0.py").write_text("updated = True\n")
    start = time.perf_counter()
    static_upload = 0
    for b, t, change in tasks:
        static_upload += publish_image(b, t, change, 0, "2026-01-02T00:00:00Z")
    static_update = time.perf_counter() - start
    start = time.perf_counter()
    r = publish_group(group_store, "harness/h0:1", [harness_trees[0]], created="2026-01-02T00:00:00Z")
    group_update = time.perf_counter() - start
    group_upload = r.uploaded_bytes

    from rollstack_bench.report import machine_facts

    doc = {
        "shape": {"repos": repos, "tasks": len(tasks), "harnesses": harnesses},
        "systems": {
            "static-images": {"artifacts": static_summary["artifacts"], "stored_bytes": _stored_bytes(work / "static-store"),
                              "publish_seconds": static_publish, "harness_update": {
                                  "artifacts_republished": len(tasks), "uploaded_bytes": static_upload, "seconds": static_update}},
            "layer-groups": {"artifacts": group_summary["artifacts"], "stored_bytes": _stored_bytes(work / "group-store"),
                             "publish_seconds": group_publish, "task_diff_bytes": diff_bytes, "harness_update": {
                                 "artifacts_republished": 1, "uploaded_bytes": group_upload, "seconds": group_update}},
        },
        "machine": machine_facts(),
        "command": command,
    }
    s, g = doc["systems"]["static-images"], doc["systems"]["layer-groups"]
    doc["ratios"] = {
        "artifacts": s["artifacts"] / g["artifacts"],
        "stored_bytes": s["stored_bytes"] / g["stored_bytes"],
        "update_uploaded_bytes": s["harness_update"]["uploaded_bytes"] / max(1, g["harness_update"]["uploaded_bytes"]),
        "update_seconds": s["harness_update"]["seconds"] / max(1e-9, g["harness_update"]["seconds"]),
    }
    return doc


def _human(doc: dict[str, Any]) -> None:
    sh = doc["shape"]
    print(f"B={sh['repos']} repos, T={sh['tasks']} tasks, H={sh['harnesses']} harnesses")
    for name, s in doc["systems"].items():
        u = s["harness_update"]
        print(f"  {name:14s} artifacts {s['artifacts']:4d}  stored {s['stored_bytes'] / 2**20:8.1f} MiB  "
              f"publish {s['publish_seconds']:6.2f} s  | harness update: {u['artifacts_republished']} artifact(s), "
              f"{u['uploaded_bytes'] / 2**20:.2f} MiB, {u['seconds']:.2f} s")
    r = doc["ratios"]
    print(f"  static / groups: artifacts {r['artifacts']:.1f}x, stored bytes {r['stored_bytes']:.1f}x, "
          f"update bytes {r['update_uploaded_bytes']:.1f}x, update time {r['update_seconds']:.1f}x")
    m = doc["machine"]
    print(f"  machine: {m['cpu']} x{m['cores']}, load {m['loadavg']:.2f}; command: {doc['command']}")


def register(app: typer.Typer) -> None:
    @app.command("packaging")
    def packaging_bench(
        repos: int = typer.Option(2, "--repos", help="B: repository bases"),
        tasks: int = typer.Option(5, "--tasks-per-repo", help="tasks per repository"),
        harnesses: int = typer.Option(3, "--harnesses", help="H: harnesses"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """Layer groups (B + 2 + H artifacts) vs static images (T x H): storage and harness-update cost."""
        command = " ".join(["rollstack", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "rollstack bench packaging"
        with tempfile.TemporaryDirectory(prefix="rollstack-bench-packaging-") as tmp:
            doc = run(repos, tasks, harnesses, Path(tmp), command)
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            _human(doc)
