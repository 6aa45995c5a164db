"""The corpus builder's specs, task selection and build cache (rollstack_corpus)."""

from __future__ import annotations

import pytest

from rollstack.errors import InvalidRequest

from rollstack.tasks.model import Component, CorpusManifest, dump_tasks
from rollstack_corpus.bugs import Mutation
from rollstack_corpus.discovery import select_tasks
from rollstack_corpus.spec import RepoSpec, full, get, small
from task_helpers import task


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


def test_built_corpus_comes_back_from_cache_without_building(tmp_path) -> None:
    from rollstack_corpus import build as corpus_mod

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


def test_the_cache_key_of_code_ignores_docstrings_and_comments_not_code() -> None:
    from rollstack_corpus.build import code_key

    base = b'"""Doc."""\n\ndef f(x):\n    """What f does."""\n    return x < 1  # small\n'
    same = b'"""Other doc."""\n\ndef f(x):\n    """Says more."""\n    return x < 1\n'
    other = b'"""Doc."""\n\ndef f(x):\n    """What f does."""\n    return x <= 1\n'
    assert code_key(base) == code_key(same) != code_key(other)
    assert code_key(b'def g():\n    """Only a docstring."""\n') == code_key(b"def g():\n    pass\n")
