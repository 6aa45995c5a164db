"""Moved to `rollstack.bench.systems.containerd`. This name stays only for bench/init.py, bench/fetch.py and
bench/iteration.py (edited on another branch during this merge); delete it once they import
from the new place."""

from rollstack.bench.systems.containerd import drop_page_cache  # noqa: F401
