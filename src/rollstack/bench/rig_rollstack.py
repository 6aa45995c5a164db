"""Moved to `rollstack.bench.systems.rollstack`. This name stays only for bench/init.py, bench/fetch.py and
bench/iteration.py (edited on another branch during this merge); delete it once they import
from the new place."""

from rollstack.bench.systems.rollstack import (  # noqa: F401
    ROLLSTACK_SYSTEMS, SYSTEM_NAMES, Creation, RollstackSystem, first_command, forget_shared_traces,
    publish_components, seed_layer_cache, work_lock,
)
