"""Task generation and checking: which injected bugs break which named tests, proven in a chroot.

`discover_tasks` samples candidate mutations in a repository's source files, runs its tests once
clean and once per candidate (one chroot of os + repo, no network), and keeps bugs that make
between 1 and `max_fail_to_pass` previously passing tests fail. `check_tasks` then proves every
task in a chroot of os + repo + evaluator, using the evaluator's own scorer: `git apply` the
patch -> FAIL_TO_PASS fail and PASS_TO_PASS pass; `git apply -R` -> all pass.
The selection logic (`select_tasks`) is pure.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollstack_corpus import runner as corpus_runner
from rollstack_corpus.bugs import Mutation, apply_mutation, find_mutations, sample_mutations, unified_diff
from rollstack.tasks.model import Task, dump_tasks
from rollstack.tasks.plans import EVAL_DIR
from rollstack_corpus.spec import RepoSpec, test_command
from rollstack_corpus.tree import ChrootStep, check_step, default_env, remove_tree
from rollstack.errors import RuntimeFailure

PASSED = "passed"


@dataclass(frozen=True)
class StepOptions:
    """Extra chroot settings for test runs (tests use them to borrow the host's Python)."""

    ro_binds: tuple[tuple[Path, str], ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def candidate_mutations(repo_tree: Path, repo: RepoSpec, k: int) -> list[tuple[Mutation, str, str]]:
    """(mutation, original text, mutated text) for up to k sampled candidates."""
    root = repo_tree / repo.workdir.lstrip("/")
    pool: list[Mutation] = []
    sources: dict[str, str] = {}
    for rel in repo.mutate:
        text = (root / rel).read_text()
        sources[rel] = text
        pool.extend(find_mutations(rel, text))
    out = []
    for m in sample_mutations(pool, k * 2, seed=f"{repo.name}=={repo.version}"):
        try:
            out.append((m, sources[m.path], apply_mutation(sources[m.path], m)))
        except (ValueError, SyntaxError):
            continue
        if len(out) == k:
            break
    return out


def select_tasks(repo: RepoSpec, baseline: dict[str, str], runs: dict[str, dict[str, str]],
                 cands: list[tuple[Mutation, str, str]], want: int, max_f2p: int) -> list[Task]:
    """Tasks from discovery results: bugs breaking 1..max_f2p tests that passed clean."""
    passing_all = {t for t, v in baseline.items() if v == PASSED and not t.startswith("<collect>")}
    tasks: list[Task] = []
    for n, (m, before, after) in enumerate(cands):
        res = runs.get(str(n))
        if not res or any(t.startswith("<collect>") for t in res):
            continue
        run_files = set(repo.tests_for(m.path))
        passing = {t for t in passing_all if t.split("::", 1)[0] in run_files}
        f2p = sorted(t for t in passing if res.get(t) != PASSED)
        if not 1 <= len(f2p) <= max_f2p:
            continue
        files = sorted({t.split("::", 1)[0] for t in f2p})
        p2p = sorted(t for t in passing if res.get(t) == PASSED and t.split("::", 1)[0] in files)
        idx = len(tasks)
        tasks.append(Task(
            instance_id=f"{repo.name}.{repo.version}.{m.kind}__{idx}",
            repo=repo.name, version=repo.version, workdir=repo.workdir,
            patch=unified_diff(m.path, before, after), fix=unified_diff(m.path, after, before),
            FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p,
            test_command=test_command(files),
            mutation=m.to_dict(),
        ))
        if len(tasks) == want:
            break
    return tasks


def discover_tasks(os_tree: Path, repo_tree: Path, repo: RepoSpec, want: int, k: int,
                   max_f2p: int, scratch: Path, step: StepOptions | None = None) -> list[Task]:
    cands = candidate_mutations(repo_tree, repo, k)
    spec = {
        "workdir": repo.workdir, "test_command": repo.test_command, "timeout": 600,
        "candidates": [{"id": str(n), "path": m.path, "mutated": after, "test_command": test_command(repo.tests_for(m.path))}
                       for n, (m, _, after) in enumerate(cands)],
    }
    out = _run_runner(os_tree, [repo_tree], scratch, f"discover-{repo.name}", "python3", "discover",
                      {"spec.json": json.dumps(spec)}, step=step)
    base = out["baseline"]["results"]
    if not any(v == PASSED for v in base.values()):
        raise RuntimeFailure(f"{repo.name}: no test passes on the clean tree (exit {out['baseline']['exit_code']})")
    runs = {cid: r["results"] for cid, r in out["candidates"].items()}
    return select_tasks(repo, base, runs, cands, want, max_f2p)


def check_tasks(os_tree: Path, repo_tree: Path, eval_tree: Path, tasks: list[Task],
                scratch: Path, step: StepOptions | None = None) -> list[dict[str, Any]]:
    """One verdict per task (`ok`, `reason`, buggy/fixed scores) from the evaluator in a chroot."""
    if not tasks:
        return []
    return _run_runner(os_tree, [eval_tree, repo_tree], scratch, f"check-{tasks[0].repo}",
                       f"env PYTHONPATH={EVAL_DIR}/boot python3 {EVAL_DIR}/corpus_runner.py", "check",
                       {"tasks.jsonl": dump_tasks(tasks)}, runner_in_tree=True, step=step)


def _run_runner(os_tree: Path, trees: list[Path], scratch: Path, name: str, python: str, mode: str,
                inputs: dict[str, str], runner_in_tree: bool = False, step: StepOptions | None = None) -> Any:
    opts = step or StepOptions()
    io = scratch / f"{name}-io"
    upper = scratch / f"{name}-upper"
    remove_tree(io)
    io.mkdir(parents=True)
    try:
        for fname, text in inputs.items():
            (io / fname).write_text(text)
        shutil.copy(corpus_runner.__file__, io / "corpus_runner.py")
        runner = python if runner_in_tree else f"{python} /tmp/rs-io/corpus_runner.py"
        arg = next(iter(inputs))
        script = f"{runner} {mode} /tmp/rs-io/{arg} /tmp/rs-io/out.json"
        check_step(ChrootStep(trees + [os_tree], upper, script, network=False, binds=[(io, "/tmp/rs-io")],
                              ro_binds=list(opts.ro_binds), env={**default_env(), **opts.env}),
                   scratch, f"{mode} ({name})")
        return json.loads((io / "out.json").read_text())
    finally:
        remove_tree(io)
        remove_tree(upper)
