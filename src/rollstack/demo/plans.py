"""Moved to `rollstack.corpus.plans`. This name stays only because bench/init.py and
bench/iteration.py (edited on another branch) import `stack_groups` / `rollout_plan` from here;
delete it once they import from `rollstack.corpus.plans`."""

from rollstack.corpus.plans import rollout_plan, stack_groups  # noqa: F401
