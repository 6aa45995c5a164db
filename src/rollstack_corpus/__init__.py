"""The SWE task corpus builder: fixtures for the demo, the tests and the benchmarks, beside the
product (like `rollstack_bench`; `make setup` installs both, `rollstack bench corpus` drives it).

- `spec`, `tree`, `components`, `bugs`, `discovery`, `runner`: building the trees and the tasks
- `build`: `build_corpus()` / `load_corpus()` / `publish_corpus()` (the cached build)
- `cache`: `ensure_corpus()` -> `LoadedCorpus`; `publish`: groups with a publish cache

The task model and the one task -> plan function are the product's (`rollstack.tasks`): the
integrations turn anyone's SWE-smith tasks into plans without this package. It imports the
product (plan, store, tasks), never the demo or the benchmarks.
"""
