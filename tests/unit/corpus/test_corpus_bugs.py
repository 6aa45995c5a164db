"""Bug injection: mutation sites, application, diffs, sampling (pure)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstack_corpus.bugs import Mutation, apply_mutation, find_mutations, sample_mutations, unified_diff

SRC = '''\
import os

LIMIT = 3  # module level: never mutated


class Box:
    def fits(self, n):
        # n < 3 in a comment stays
        return n < self.size and n >= 0


def total(xs):
    s = 0
    for x in xs:
        s = s + x
    return s == "a < b" or False


def inner():
    def helper(a, b):
        return a - b
    return helper
'''


def test_finds_sites_inside_functions_only() -> None:
    ms = find_mutations("m.py", SRC)
    assert all(m.function for m in ms)
    assert not any(m.line == 3 for m in ms)  # LIMIT = 3 at module level
    kinds = {(m.function, m.old, m.new) for m in ms}
    assert ("Box.fits", "<", "<=") in kinds and ("Box.fits", ">=", ">") in kinds
    assert ("Box.fits", "and", "or") in kinds
    assert ("total", "0", "1") in kinds and ("total", "+", "-") in kinds and ("total", "==", "!=") in kinds
    assert ("total", "False", "True") in kinds
    assert ("inner.helper", "-", "+") in kinds  # nested function gets its own qualified name
    assert len({(m.line, m.col) for m in ms}) == len(ms)


def test_apply_changes_exactly_one_token_and_keeps_strings() -> None:
    for m in find_mutations("m.py", SRC):
        out = apply_mutation(SRC, m)
        ast.parse(out)
        a, b = SRC.splitlines(), out.splitlines()
        changed = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        assert changed == [m.line - 1]
        assert '"a < b"' in out and "# n < 3 in a comment stays" in out


def test_apply_rejects_stale_location() -> None:
    m = Mutation("m.py", 9, 15, "<", "<=", "op_swap", "Box.fits")
    with pytest.raises(ValueError):
        apply_mutation(SRC.replace("n < self.size", "n > self.size"), m)
    with pytest.raises(ValueError):
        apply_mutation(SRC, Mutation("m.py", 999, 0, "x", "y", "op_swap", "f"))


def test_unified_diff_applies_with_git_and_reverses(tmp_path: Path) -> None:
    m = next(m for m in find_mutations("pkg/m.py", SRC) if m.old == "<")
    after = apply_mutation(SRC, m)
    patch, fix = unified_diff("pkg/m.py", SRC, after), unified_diff("pkg/m.py", after, SRC)
    assert patch.startswith("diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ ")
    (tmp_path / "pkg").mkdir()
    f = tmp_path / "pkg" / "m.py"
    f.write_text(SRC)
    subprocess.run(["git", "apply"], input=patch.encode(), cwd=tmp_path, check=True)
    assert f.read_text() == after
    subprocess.run(["git", "apply"], input=fix.encode(), cwd=tmp_path, check=True)
    assert f.read_text() == SRC


def test_unified_diff_rejects_no_change_and_missing_newline() -> None:
    with pytest.raises(ValueError):
        unified_diff("a.py", "x = 1\n", "x = 1\n")
    with pytest.raises(ValueError):
        unified_diff("a.py", "x = 1", "x = 2")


def test_sampling_is_deterministic_and_one_per_function() -> None:
    ms = find_mutations("m.py", SRC)
    a, b = sample_mutations(ms, 10, "seed"), sample_mutations(ms, 10, "seed")
    assert a == b
    assert len({m.function for m in a}) == len(a) == len({m.function for m in ms})
    assert len(sample_mutations(ms, 2, "seed")) == 2


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(["<", "<=", ">", ">=", "==", "!=", "+", "-"]), a=st.integers(0, 20), b=st.integers(0, 20),
       pad=st.text(alphabet=" ", max_size=3))
def test_every_found_mutation_round_trips(op: str, a: int, b: int, pad: str) -> None:
    src = f"def f(x):\n    y = x {op} {a}\n    return y{pad}{op}{pad}{b}\n"
    for m in find_mutations("f.py", src):
        out = apply_mutation(src, m)
        back = Mutation(m.path, m.line, m.col, m.new, m.old, m.kind, m.function)
        assert apply_mutation(out, back) == src
