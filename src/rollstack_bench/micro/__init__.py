"""Stage micro-benchmarks, run as modules: `python -m rollstack_bench.micro.store [MiB]` (both
artifact stores side by side) and `python -m rollstack_bench.micro.runtime` (overlay mount,
runc start/exec/update, destroy). They measure one stage below the node; the `rollstack bench`
suites measure through it."""
