"""The SWE task corpus: one `Task` model (SWE-smith schema), the corpus builder, and the one
task -> plan function every consumer uses (the demo, the benchmarks, the integrations).

- `model`: `Task`, `Component`, `CorpusManifest`, tasks.jsonl (pure)
- `plans`: `StackGroups`, `task_plan()` / `rollout_plan()`, the evaluator's scorer command (pure)
- `spec`, `tree`, `components`, `bugs`, `discovery`, `runner`: building the trees and the tasks
- `build`: `build_corpus()` / `load_corpus()` / `publish_corpus()` (the cached build)
- `cache`: `ensure_corpus()` -> `LoadedCorpus`; `publish`: groups with a publish cache

Sits above `plan` and `store` (it writes plans and publishes groups) and below the node's
consumers; it never imports the node, the client, the demo or the benchmarks.
"""
