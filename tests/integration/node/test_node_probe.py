"""`probe_group` (`group import/publish --probe`): the command runs once in a throwaway
environment, its access trace lands in the store as the stack's shared trace, and a fresh node's
first environment of that stack finds it (and prefetches) instead of starting first-ever."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_helpers import publish_corpus  # noqa: E402

from rollstack.fetch import shared_traces  # noqa: E402
from rollstack.node.probe import probe_group  # noqa: E402
from rollstack.store import open_store  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_probe_publishes_the_stack_trace_a_fresh_node_uses(tmp_path):
    from rollstack.client.local import Node

    store = publish_corpus(tmp_path / "store", tmp_path / "build")
    groups = ["os/busybox:1", "repo/app:1"]
    st = open_store(store)
    before = st.list_tags(shared_traces.REPO)
    import tempfile

    probes_before = set(Path(tempfile.gettempdir()).glob("rsprobe-*"))
    out = probe_group(store, groups, "cat /work/app/* >/dev/null; /bin/busybox ls /bin >/dev/null")
    assert out["exit_code"] == 0 and out["published"] >= 1 and out["trace_key"].endswith("/stack")
    assert shared_traces.trace_tag(out["trace_key"]) in set(st.list_tags(shared_traces.REPO)) - set(before)
    assert set(Path(tempfile.gettempdir()).glob("rsprobe-*")) <= probes_before  # the probe's node is gone
    node = Node(store=store, root=tmp_path / "fresh", lowers={"materialize_after": 0})
    try:
        env = node.create({"name": "after-probe", "groups": groups, "workdir": "/"})
        try:
            assert node.service.stages.lazy.env_stats(env.id).get("trace_prefetch_chunks", 0) > 0
        finally:
            env.destroy()
    finally:
        node.close()
