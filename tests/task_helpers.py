"""A complete task in the SWE-smith schema (`task(**overrides)`), for the unit tests of the task
model and of the corpus builder."""

from __future__ import annotations

from rollstack.tasks.model import Task

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
FIX = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 2\n+x = 1\n"


def task(**kw) -> Task:
    base = dict(instance_id="r.1.op_swap__0", repo="r", patch=PATCH, fix=FIX, FAIL_TO_PASS=["t.py::a"],
                PASS_TO_PASS=["t.py::b"], test_command="python3 -m pytest t.py", workdir="/work/r")
    base.update(kw)
    return Task(**base)
