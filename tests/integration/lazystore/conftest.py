"""Fixtures shared by the lazy store's integration tests: daemons and environment cgroups."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from components import need
from lazystore_fixtures import CGROUP_ROOT

from rollstack.lazystore.client import LazyStoreClient
from rollstack.lazystore.config import DaemonConfig


@pytest.fixture
def lazy_factory(tmp_path: Path):
    """Starts lazy store daemons (one per `name`, own mountpoint and state) and stops them all;
    keyword arguments are DaemonConfig or FetchConfig fields (`DaemonConfig.of`)."""
    started: list[LazyStoreClient] = []

    def start(store_url: str, name: str = "node", **kw) -> LazyStoreClient:
        c = LazyStoreClient.start(DaemonConfig.of(tmp_path / name / "mnt", tmp_path / name / "state", store_url, **kw))
        started.append(c)
        return c

    try:
        yield start
    finally:
        for c in reversed(started):
            c.stop()


@pytest.fixture
def env_cgroups():
    """Creates cgroups `rollstack/<id>` (pids controller, v1) and removes them afterwards."""
    need((CGROUP_ROOT / "cgroup.procs").exists(), "a cgroup v1 pids hierarchy")
    made: list[Path] = []

    def make(env_id: str) -> Path:
        path = CGROUP_ROOT / "rollstack" / env_id
        path.mkdir(parents=True, exist_ok=True)
        made.append(path)
        return path

    try:
        yield make
    finally:
        for p in made:
            for _ in range(50):
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
