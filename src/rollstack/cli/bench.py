"""`rollstack bench ...`: every benchmark, one command group.

Each benchmark lives in `rollstack_bench.<name>` (measurement is a package of its own, beside
the product: `make setup` installs both) and exposes `register(app)`, which adds its command(s)
to this group. Benchmarks import heavy dependencies lazily. Without `rollstack_bench` installed
the group is empty.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True, help="Benchmarks (each prints a report; --json for one JSON document).")

BENCHMARKS = ("convert", "mutation", "fetch", "env", "elastic", "corpus", "init", "iteration", "packaging", "e2b",
              "cluster", "cluster_sim", "node", "isolation", "exec_overhead", "prefetch", "materialize", "chaos", "fork")

BENCHMARKS += ("imports",)  # `bench import` (a module cannot be named `import`)
for _name in BENCHMARKS:
    _modname = f"rollstack_bench.{_name}"
    try:
        _mod = importlib.import_module(_modname)
    except ModuleNotFoundError as exc:  # a benchmark not written yet; real import errors propagate
        if exc.name not in (_modname, "rollstack_bench"):
            raise
        continue
    _mod.register(app)
