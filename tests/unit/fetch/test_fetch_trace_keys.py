"""The lazy store's trace keys the node derives from a plan: one per task, one per stack."""

from __future__ import annotations

from rollstack.fetch.traces import trace_keys
from rollstack.plan.model import load_plan


def plan(name: str, patch: str | None = None):
    doc = {"name": name, "groups": ["repo/x:1"]}
    if patch is not None:
        doc["mutation_text"] = patch
    return load_plan(doc)


def test_rollouts_of_one_task_share_a_key_and_tasks_of_one_stack_share_the_other():
    s = "sha256:" + "ab" * 32
    a1, a2 = trace_keys(s, plan("task-a", "diff --git a/x b/x\n")), trace_keys(s, plan("task-a", "diff --git a/x b/x\n"))
    b = trace_keys(s, plan("task-a", "diff --git a/y b/y\n"))
    c = trace_keys(s, plan("task-c"))
    assert a1 == a2
    assert a1[0] != b[0] != c[0] and a1[1] == b[1] == c[1] == f"{s}/stack"
    assert trace_keys("sha256:" + "cd" * 32, plan("task-a"))[1] != a1[1]
    assert trace_keys(None, plan("task-a")) == (None, None)


def test_the_rollouts_of_a_task_share_its_key_whatever_their_names():
    s = "sha256:" + "ab" * 32
    patch = "diff --git a/x b/x\n"
    assert trace_keys(s, plan("task-a-r0", patch)) == trace_keys(s, plan("task-a-r7", patch))
