"""Task discovery and checking in real overlay chroots, on a tiny synthetic repository.

No debootstrap: the "OS tree" is a skeleton whose /usr and Python come from the host through
read-only bind mounts, so the same code path (overlay step, chroot, no network, git apply,
pytest with the result plugin, the evaluator's scorer) runs in seconds.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from components import require_tool
from rollstack_corpus import runner as corpus_runner
from rollstack_corpus.bugs import unified_diff
from rollstack.tasks.model import Task
from rollstack.tasks.plans import EVAL_DIR
from rollstack_corpus.spec import RepoSpec
from rollstack_corpus.discovery import StepOptions, check_tasks, discover_tasks
from rollstack_corpus.tree import ChrootStep, run_step, tree_stats

pytestmark = pytest.mark.integration

TINYLIB = '''\
def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    s = 0
    for x in xs:
        s = s + x
    return s


def is_even(n):
    return n % 2 == 0


def describe(n):
    # a comment with < and == that must never be mutated
    return "even" if is_even(n) else "odd"
'''

TESTS = '''\
from tinylib import clamp, total, is_even, describe


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_edges():
    assert clamp(0, 0, 10) == 0 and clamp(10, 0, 10) == 10


def test_total():
    assert total([1, 2, 3]) == 6


def test_is_even():
    assert is_even(4) and not is_even(3)


def test_describe():
    assert describe(2) == "even"
'''

REPO = RepoSpec(name="tiny", version="1.0", test_deps=(), mutate=("tinylib.py",), tests=("tests/test_tinylib.py",))


def _host_python() -> tuple[Path, Path]:
    """(venv dir, base interpreter prefix) of the Python running these tests (it has pytest)."""
    venv = Path(sys.prefix)
    base = Path(sys.base_prefix)
    return venv, base


@pytest.fixture
def trees(tmp_path: Path):
    require_tool("git")
    venv, base = _host_python()
    os_tree = tmp_path / "os"
    for d in ("usr", "proc", "dev", "tmp", "etc", "work", "opt/hostvenv", f"{base}".lstrip("/")):
        (os_tree / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        (os_tree / link).symlink_to(target)
    repo_tree = tmp_path / "repo-tiny"
    wd = repo_tree / "work" / "tiny"
    (wd / "tests").mkdir(parents=True)
    (wd / "tinylib.py").write_text(TINYLIB)
    (wd / "tests" / "test_tinylib.py").write_text(TESTS)
    (wd / "pytest.ini").write_text("[pytest]\n")
    eval_tree = tmp_path / "evaluator"
    (eval_tree / EVAL_DIR.lstrip("/")).mkdir(parents=True)
    shutil.copy(corpus_runner.__file__, eval_tree / EVAL_DIR.lstrip("/") / "corpus_runner.py")
    opts = StepOptions(
        ro_binds=((Path("/usr"), "/usr"), (venv, "/opt/hostvenv"), (base, str(base))),
        env={"PATH": "/opt/hostvenv/bin:/usr/bin:/bin"},
    )
    return os_tree, repo_tree, eval_tree, opts, tmp_path / "scratch"


def test_discover_then_check_tiny_repo(trees) -> None:
    os_tree, repo_tree, eval_tree, opts, scratch = trees
    before = (repo_tree / "work/tiny/tinylib.py").read_text()
    tasks = discover_tasks(os_tree, repo_tree, REPO, want=3, k=12, max_f2p=5, scratch=scratch, step=opts)
    assert len(tasks) >= 2
    for t in tasks:
        assert t.FAIL_TO_PASS and all(x.startswith("tests/test_tinylib.py::") for x in t.FAIL_TO_PASS)
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert t.mutation["function"] in {"clamp", "total", "is_even", "describe"}
    verdicts = check_tasks(os_tree, repo_tree, eval_tree, tasks, scratch, step=opts)
    assert [v["ok"] for v in verdicts] == [True] * len(tasks), verdicts
    # Discovery and checking ran in throwaway uppers: the trees are untouched.
    assert (repo_tree / "work/tiny/tinylib.py").read_text() == before
    assert tree_stats(eval_tree).files == 1
    assert not list(scratch.glob("*-upper")) and not list(scratch.glob("*-io"))


def test_check_rejects_a_bug_that_breaks_nothing(trees) -> None:
    os_tree, repo_tree, eval_tree, opts, scratch = trees
    harmless = TINYLIB.replace("a comment with", "a remark with")
    task = Task(
        instance_id="tiny.1.0.fake__0", repo="tiny", workdir="/work/tiny", version="1.0",
        patch=unified_diff("tinylib.py", TINYLIB, harmless), fix=unified_diff("tinylib.py", harmless, TINYLIB),
        FAIL_TO_PASS=["tests/test_tinylib.py::test_describe"], PASS_TO_PASS=["tests/test_tinylib.py::test_total"],
        test_command="python3 -m pytest -p no:cacheprovider -q tests/test_tinylib.py",
    )
    (verdict,) = check_tasks(os_tree, repo_tree, eval_tree, [task], scratch, step=opts)
    assert verdict["ok"] is False
    assert verdict["buggy"]["fail_to_pass"] == {"tests/test_tinylib.py::test_describe": "passed"}


def test_step_without_network_and_diff_capture(trees) -> None:
    os_tree, _, _, opts, scratch = trees
    upper = scratch.parent / "upper"
    res = run_step(ChrootStep([os_tree], upper, "echo hi > /work/new.txt\nrm -rf /etc\n"
                              "python3 -c 'import socket; print(len(socket.if_nameindex()))'",
                              network=False, ro_binds=list(opts.ro_binds), env={"PATH": opts.env["PATH"]}), scratch)
    assert res.returncode == 0, res.output
    assert res.output.strip().endswith("1")  # only loopback in the step's network namespace
    assert (upper / "work" / "new.txt").read_text() == "hi\n"
    assert tree_stats(upper).whiteouts == 1  # /etc deleted -> one overlay whiteout
    assert (os_tree / "etc").is_dir()  # the lower tree is untouched
    mounts = Path("/proc/self/mounts").read_text()
    assert str(scratch) not in mounts and os.path.isdir(os_tree / "usr")
