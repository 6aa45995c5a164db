"""A full node disk during a snapshot or a fork (docs/fork.md): the call answers `disk_full`
(retryable), the environment runs on unfrozen with its files, nothing half-made is left (no
copy, no fork layer, no published snapshot), and the same call succeeds once space is free."""

from __future__ import annotations

import os

import pytest

from node_helpers import leftovers, plan, remember, serve_node, sh as _sh
from rollstack import Client, errors
from rollstack_bench.chaos_faults import small_fs, unmount_small_fs

pytestmark = pytest.mark.integration
TOKEN = "disk-full-token"


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("disk-full")
    root = base / "node"
    small_fs(base / "root.img", root, 160)
    try:
        # fork layers: a 4 MiB tmpfs, so the big diff goes to the full disk and a small one to memory
        with serve_node(root, corpus, TOKEN, max_environments=4, warm_pool=0, fork_memory=4 << 20) as (service, server):
            with Client(server.url, token=TOKEN, lease=None) as client:
                yield root, client
    finally:
        unmount_small_fs(root)



def _free(root) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


def test_a_snapshot_or_fork_on_a_full_disk_is_disk_full_and_leaves_nothing(node) -> None:
    root, client = node
    env = client.create(plan())
    remember(root, env.id)
    try:
        big = int(_free(root) * 0.6)  # its copy cannot fit beside it
        _sh(env, f"head -c {big} /dev/zero > /work/app/big.bin && echo kept > /work/app/small.txt")
        with pytest.raises(errors.DiskFull) as info:
            env.snapshot("full/disk:1")
        assert info.value.retryable
        with pytest.raises(errors.DiskFull):
            env.fork(1)
        assert _sh(env, "cat small.txt && echo running") == "kept\nrunning\n"  # not left frozen
        assert [s for s in client.snapshots() if s.plan == "full/disk:1"] == []
        assert not [p for p in root.iterdir() if p.name.startswith("snapshot-")]
        assert leftovers(root)["forks"] == []
        assert [e.id for e in client.list()] == [env.id]  # no half-made child

        _sh(env, "rm big.bin")  # space is back: the same calls succeed
        snap = env.snapshot("full/disk:1")
        assert snap.plan == "full/disk:1"
        [child] = env.fork(1)
        remember(root, child.id)
        assert _sh(child, "cat small.txt") == "kept\n"
        assert [n.split("/")[0] for n in leftovers(root)["forks"]] == ["mem"]  # small: in memory
        child.destroy()
    finally:
        for e in client.list():
            client.destroy(e.id)
        if any(s.plan == "full/disk:1" for s in client.snapshots()):
            client.delete_snapshot("full/disk:1")
