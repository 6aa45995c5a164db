"""Moved to `rollstack.bench.systems.baselines`. This name stays only for bench/init.py, bench/fetch.py and
bench/iteration.py (edited on another branch during this merge); delete it once they import
from the new place."""

from rollstack.bench.systems.baselines import make_system, prepare_images, stacks_from_corpus  # noqa: F401
