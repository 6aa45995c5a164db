"""Task schema (SWE-smith fields), tasks.jsonl round trip, manifest helpers, task selection."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollstack.corpus.bugs import Mutation
from rollstack.corpus.model import Component, CorpusManifest, Task, dump_tasks, load_tasks, validate_tasks
from rollstack.corpus.spec import RepoSpec, full, get, small
from rollstack.corpus.discovery import select_tasks
from rollstack.errors import InvalidRequest

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
FIX = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 2\n+x = 1\n"


def task(**kw) -> Task:
    base = dict(instance_id="r.1.op_swap__0", repo="r", patch=PATCH, fix=FIX, FAIL_TO_PASS=["t.py::a"],
                PASS_TO_PASS=["t.py::b"], test_command="python3 -m pytest t.py", workdir="/work/r")
    base.update(kw)
    return Task(**base)


def test_round_trip_and_schema_order() -> None:
    ts = [task(), task(instance_id="r.1.op_swap__1")]
    text = dump_tasks(ts)
    assert text.count("\n") == 2
    assert text.splitlines()[0].startswith('{"instance_id": "r.1.op_swap__0", "repo": "r", "patch":')
    assert load_tasks(text) == ts


@pytest.mark.parametrize("bad", [
    {"instance_id": "has space"}, {"instance_id": "../x"}, {"patch": "not a diff"},
    {"fix": "--- a/x\n+++ b/x\n"}, {"workdir": "work/r"}, {"workdir": "/work/../etc"},
])
def test_invalid_tasks_are_rejected(bad) -> None:
    with pytest.raises(ValidationError):
        task(**bad)


@pytest.mark.parametrize("missing", [{"FAIL_TO_PASS": []}, {"fix": None}, {"test_command": None}, {"workdir": None},
                                     {"patch": ""}])
def test_a_corpus_task_must_be_complete(missing) -> None:
    task(**missing)  # a task file may leave it out...
    with pytest.raises(InvalidRequest, match="a corpus task needs"):
        validate_tasks([task(**missing)])  # ...the corpus may not


def test_corpus_level_checks() -> None:
    with pytest.raises(InvalidRequest, match="duplicate"):
        validate_tasks([task(), task()])
    with pytest.raises(InvalidRequest, match="both"):
        validate_tasks([task(PASS_TO_PASS=["t.py::a"])])
    with pytest.raises(InvalidRequest, match="line 2"):
        load_tasks(dump_tasks([task()]) + '{"instance_id": "x"}\n')


def test_manifest_stack_sums() -> None:
    m = CorpusManifest(flavor="small", tasks=4, components=[
        Component(name="os", kind="os", group="os/d:b", bytes=100, files=10),
        Component(name="repo-r", kind="repo", group="repo/r:1", base="os", bytes=5, files=2),
        Component(name="harness-h", kind="harness", group="harness/h:1", base="os", bytes=50, files=7),
    ])
    assert m.stack_bytes(["os", "repo-r", "harness-h"]) == 155
    assert m.stack_files(["os", "harness-h"]) == 17
    with pytest.raises(InvalidRequest):
        m.component("nope")


def test_specs_meet_the_issue_minimums() -> None:
    s, f = small(), full()
    assert len(s.repos) == 1 and s.tasks_per_repo == 4
    assert len(f.repos) >= 4 and len(f.harnesses) >= 2 and len(f.repos) * f.tasks_per_repo >= 32
    for r in f.repos:
        assert set(dict(r.test_map)) <= set(r.mutate)
        assert all(t in r.tests for files in dict(r.test_map).values() for t in files)
    assert s.fingerprint("x") != f.fingerprint("x") and s.os_fingerprint() != f.os_fingerprint()
    assert s.repo_fingerprint(s.repos[0]) == small().repo_fingerprint(small().repos[0])
    with pytest.raises(ValueError):
        get("huge")


def test_select_tasks_from_discovery_results() -> None:
    repo = RepoSpec(name="r", version="1", test_deps=(), mutate=("m.py", "n.py"), tests=("t.py", "u.py"),
                    test_map=(("m.py", ("t.py",)),))
    base = {"t.py::a": "passed", "t.py::b": "passed", "t.py::c": "failed", "u.py::d": "passed"}
    before, after = "x = 1\n", "x = 2\n"
    cands = [
        (Mutation("m.py", 1, 4, "1", "2", "const_change", "f"), before, after),  # breaks t.py::a
        (Mutation("m.py", 1, 4, "1", "2", "const_change", "g"), before, after),  # breaks nothing
        (Mutation("n.py", 1, 4, "1", "2", "const_change", "h"), before, after),  # breaks everything
        (Mutation("m.py", 1, 4, "1", "2", "const_change", "i"), before, after),  # collection error
        (Mutation("n.py", 1, 4, "1", "2", "const_change", "j"), before, after),  # breaks u.py::d
    ]
    runs = {
        "0": {"t.py::a": "failed", "t.py::b": "passed", "t.py::c": "failed"},  # u.py not run: not a failure
        "1": {"t.py::a": "passed", "t.py::b": "passed"},
        "2": {"t.py::a": "error", "t.py::b": "failed", "u.py::d": "failed"},
        "3": {"<collect>:t.py": "error"},
        "4": {"t.py::a": "passed", "t.py::b": "passed", "u.py::d": "failed"},
    }
    tasks = select_tasks(repo, base, runs, cands, want=5, max_f2p=2)
    assert [t.mutation["function"] for t in tasks] == ["f", "j"]
    assert tasks[0].FAIL_TO_PASS == ["t.py::a"] and tasks[0].PASS_TO_PASS == ["t.py::b"]
    assert tasks[0].test_command.endswith("-q t.py")
    assert tasks[1].FAIL_TO_PASS == ["u.py::d"] and tasks[1].PASS_TO_PASS == []
    assert len({t.instance_id for t in tasks}) == 2
    assert select_tasks(repo, base, runs, cands, want=1, max_f2p=2)[0].mutation["function"] == "f"


def test_plan_for_task_stacks_groups_and_scores_with_the_evaluator() -> None:
    from rollstack.corpus.build import plan_for_task

    m = CorpusManifest(flavor="small", tasks=1, components=[
        Component(name="os", kind="os", group="os/debian-python:bookworm"),
        Component(name="repo-r", kind="repo", group="repo/r:1", base="os"),
        Component(name="harness-mini-swe-agent", kind="harness", group="harness/mini-swe-agent:2.4.6", base="os"),
        Component(name="evaluator", kind="evaluator", group="evaluator/pytest:8.3.4", base="os"),
    ])
    plan = plan_for_task(m, task(), mutation="r.diff")
    assert plan["groups"] == ["os/debian-python:bookworm", "repo/r:1", "harness/mini-swe-agent:2.4.6"]
    assert plan["evaluator"]["groups"][-1] == "evaluator/pytest:8.3.4"
    assert plan["evaluator"]["command"][-1].endswith("/tasks/r.1.op_swap__0.json")
    assert plan["workdir"] == "/work/r" and plan["mutation"] == "r.diff"
    with pytest.raises(InvalidRequest):
        plan_for_task(m, task(), harness="claude-code")


def test_built_corpus_comes_back_from_cache_without_building(tmp_path) -> None:
    from rollstack.corpus import build as corpus_mod

    m = CorpusManifest(flavor="small", tasks=1, components=[Component(name="os", kind="os", group="os/d:b")])
    (tmp_path / "manifest.json").write_text(m.model_dump_json())
    (tmp_path / "tasks.jsonl").write_text(dump_tasks([task()]))
    key = f"{small().fingerprint('all')}:{corpus_mod._runner_hash()}"
    (tmp_path / ".stamps").mkdir()
    (tmp_path / ".stamps" / "manifest").write_text(key + "\n")
    logs: list[str] = []
    assert corpus_mod.build_corpus("small", tmp_path, log=logs.append) == m
    assert logs == [f"cached: {tmp_path}"]
    manifest, tasks = corpus_mod.load_corpus(tmp_path)
    assert manifest == m and tasks == [task()]
    (tmp_path / ".stamps" / "manifest").write_text("stale\n")
    assert not corpus_mod._Stamps.peek(tmp_path, "manifest", key)
    with pytest.raises(InvalidRequest):
        corpus_mod.load_corpus(tmp_path / "nothing-here")
