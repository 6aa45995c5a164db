"""Tasks and their plans: one `Task` model (SWE-smith schema) and the one task -> plan function
every consumer uses (the integrations' task sets, the demo, the benchmarks).

- `model`: `Task`, `Component`, `CorpusManifest`, tasks.jsonl (pure)
- `plans`: `StackGroups`, `task_plan()` / `rollout_plan()` / `plan_for_task()`, the evaluator's
  scorer command, the scripted agent's commands (pure)

Building a corpus of such tasks (trees, bugs, discovery) is not the product's: `rollstack_corpus`.
"""
