"""Moved to `rollstack.bench.link.netem`. This name stays only for bench/init.py, bench/fetch.py and
bench/iteration.py (edited on another branch during this merge); delete it once they import
from the new place."""

from rollstack.bench.link.netem import ShapedLink  # noqa: F401
