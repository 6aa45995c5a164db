"""Many environments created, used and destroyed at once from worker threads (as the node does)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from rollstack.run import cgroupfs, overlay
from rollstack.run.ocispec import SpecParams

pytestmark = pytest.mark.integration


def test_parallel_create_exec_destroy(runtime, busybox_lower):
    ids = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(6)]

    def cycle(env_id: str) -> bytes:
        env = runtime.create(env_id, [busybox_lower], SpecParams(env_id, cpu=0.5))
        try:
            outs = []
            for i in range(3):
                r = env.exec(f"echo {env_id}-{i} > /work/f; cat /work/f", timeout=30)
                assert r.exit_code == 0, r
                outs.append(r.stdout)
            return b"".join(outs)
        finally:
            env.destroy()

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(cycle, ids))
    for env_id, out in zip(ids, results):
        assert out == b"".join(f"{env_id}-{i}\n".encode() for i in range(3))
        assert cgroupfs.env_cgroup_dirs(env_id) == []
    assert not [mp for mp, _ in overlay.mount_points() if str(runtime.root) in mp]
    assert runtime.find_leftovers().empty()
