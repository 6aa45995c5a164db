"""`rollstack bench mutation`: how long applying a task mutation at init takes.

SWE-smith-sized patches (1-3 files, under 200 changed lines: operator flips and rewritten
blocks) are made with `git diff` on a real Python project tree (by default the installed
`matplotlib` package: 800 files, modules up to ~9k lines), then each is applied with `apply_mutation` and,
side by side in the same run, with `git apply` (a subprocess, as a naive implementation would),
restoring the tree between runs. The paper reports a median of 0.43 s; our target is p50 <= 50 ms.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import typer

from rollstack_bench import report
from rollstack.core.stats import percentile

OPS = [(" == ", " != "), (" != ", " == "), (" < ", " <= "), (" > ", " >= "), (" + ", " - "), (" - ", " + "),
       (" and ", " or "), (" or ", " and "), ("True", "False"), ("False", "True")]


def default_tree() -> Path:
    """An installed real project: matplotlib (800 files, modules up to ~9k lines), else hypothesis."""
    try:
        import matplotlib as project
    except ImportError:
        import hypothesis as project
    return Path(project.__file__).parent


def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], input=data, check=True, capture_output=True).stdout


def _restore(repo: Path) -> None:
    _git(repo, "reset", "-q", "--hard")
    _git(repo, "clean", "-qfd")


def _prepare(tree: Path, work: Path) -> tuple[Path, list[Path]]:
    repo = work / "repo"
    shutil.copytree(tree, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), symlinks=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "bench@rollstack")
    _git(repo, "config", "user.name", "bench")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    files = sorted(p for p in repo.rglob("*.py") if ".git" not in p.parts and len(p.read_bytes().splitlines()) >= 40)
    return repo, files


def _mutate_file(path: Path, rng: random.Random, budget: int) -> int:
    """One SWE-smith-like change to `path`; returns the number of changed lines (diff +/-)."""
    lines = path.read_text(errors="surrogateescape").splitlines(keepends=True)
    if rng.random() < 0.6:  # operator / constant flips on 1-3 lines
        changed = 0
        for _ in range(rng.randint(1, 3)):
            candidates = [(i, a, b) for i, line in enumerate(lines) for a, b in OPS
                          if a in line and not line.lstrip().startswith("#")]
            if not candidates:
                break
            i, a, b = rng.choice(candidates)
            lines[i] = lines[i].replace(a, b, 1)
            changed += 2
    else:  # a rewritten block: some lines dropped, some new ones in their place
        size = rng.randint(3, min(30, max(3, budget // 3)))
        start = rng.randrange(0, max(1, len(lines) - size))
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        new = [f"{indent}# rewritten ({k})\n" if k % 3 == 0 else f"{indent}value_{k} = compute({k}, value_{k - 1})\n"
               for k in range(rng.randint(1, size))]
        lines[start : start + size] = new
        changed = size + len(new)
    path.write_text("".join(lines), errors="surrogateescape")
    return changed


def make_patches(repo: Path, files: list[Path], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        chosen = rng.sample(files, rng.choice([1, 1, 2, 3]))
        budget, changed = 190, 0
        for f in chosen:
            changed += _mutate_file(f, rng, budget - changed)
        patch = _git(repo, "diff")
        _restore(repo)
        stat = [line for line in patch.splitlines() if line[:1] in (b"+", b"-") and line[:3] not in (b"+++", b"---")]
        if patch and len(stat) < 200:
            out.append({"patch": patch, "files": patch.count(b"diff --git "), "lines": len(stat)})
    return out


def _summary(times: list[float]) -> dict[str, float]:
    return {"p50": percentile(times, 50), "p95": percentile(times, 95), "mean": statistics.fmean(times),
            "max": max(times)}


def run(tree: Path, n: int, seed: int, work: Path, command: str) -> dict[str, Any]:
    from rollstack.plan.mutation import apply_mutation

    repo, files = _prepare(tree, work)
    patches = make_patches(repo, files, n, seed)
    ours, git_apply = [], []
    for p in patches:
        start = time.perf_counter()
        apply_mutation(repo, p["patch"], workdir="/")
        ours.append(time.perf_counter() - start)
        _restore(repo)
        start = time.perf_counter()
        _git(repo, "apply", "-", data=p["patch"])
        git_apply.append(time.perf_counter() - start)
        _restore(repo)
    tree_files = sum(1 for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts)
    doc = {
        "tree": {"source": str(tree), "files": tree_files},
        "patches": {"count": len(patches), "files_p50": percentile([p["files"] for p in patches], 50),
                    "files_max": max(p["files"] for p in patches),
                    "lines_p50": percentile([p["lines"] for p in patches], 50),
                    "lines_max": max(p["lines"] for p in patches)},
        "systems": {"rollstack": _summary(ours), "git-apply": _summary(git_apply)},
        "ratio_p50_git_over_rollstack": _summary(git_apply)["p50"] / _summary(ours)["p50"],
        "target_p50": 0.050,
        "paper_p50": 0.43,
        "machine": report.machine_facts(),
        "command": command,
    }
    doc["meets_target"] = doc["systems"]["rollstack"]["p50"] <= doc["target_p50"]
    return doc


def _human(doc: dict[str, Any]) -> None:
    pt = doc["patches"]
    print(f"tree: {doc['tree']['source']} ({doc['tree']['files']} files); {pt['count']} patches, "
          f"files/patch p50 {pt['files_p50']} max {pt['files_max']}, changed lines p50 {pt['lines_p50']} max {pt['lines_max']}")
    for name, s in doc["systems"].items():
        print(f"  {name:10s} p50 {s['p50'] * 1000:7.2f} ms   p95 {s['p95'] * 1000:7.2f} ms   mean {s['mean'] * 1000:7.2f} ms")
    print(f"  git apply / rollstack (p50): {doc['ratio_p50_git_over_rollstack']:.1f}x; "
          f"target p50 <= 50 ms: {'met' if doc['meets_target'] else 'MISSED'} (paper: 430 ms)")
    m = doc["machine"]
    print(f"  machine: {m['cpu']} x{m['cores']}, load {m['loadavg']:.2f}, kernel {m['kernel']}")
    print(f"  command: {doc['command']}")


def register(app: typer.Typer) -> None:
    @app.command("mutation")
    def mutation_bench(
        tree: Optional[Path] = typer.Option(None, "--tree", help="project tree to patch (default: the installed matplotlib package)"),
        count: int = typer.Option(60, "--count", help="number of patches"),
        seed: int = typer.Option(42, "--seed"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    ) -> None:
        """p50/p95 time to apply SWE-smith-sized task mutations (vs git apply, same run)."""
        command = " ".join(["rollstack", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "rollstack bench mutation"
        with tempfile.TemporaryDirectory(prefix="rollstack-bench-mutation-") as tmp:
            doc = run((tree or default_tree()).resolve(), count, seed, Path(tmp), command)
        if as_json:
            print(json.dumps(doc, indent=2))
        else:
            _human(doc)
