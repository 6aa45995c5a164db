"""`probe_group`: run a command once in a throwaway environment at publish/import time, so the
group's access trace is in the store before any node starts it (`group publish/import --probe`).

The environment runs on a temporary node (its own root under `work`, its own lazy store daemon)
against the same store. When it is destroyed, the node's lazy store publishes what the command
read as the stack's shared trace (`fetch.shared_traces`, key `<stack digest>/stack`); the first
environment of that stack on any node then prefetches it instead of missing file by file. The
probe waits until the trace is published, then removes the temporary node.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from rollstack.errors import RuntimeFailure


def probe_group(store: str, groups: Sequence[str], command: str, *, work: Path | None = None,
                workdir: str = "/", timeout: float = 600.0, publish_wait: float = 30.0) -> dict[str, Any]:
    """Run `command` (sh -c) in an environment of `groups` (top last, like a plan's `groups`);
    returns {"exit_code", "seconds", "trace_key", "published"}. A failing command still
    publishes its trace (what it read is what the stack's environments read first)."""
    from rollstack.node.config import NodeConfig
    from rollstack.contract.models import ExecRequest
    from rollstack.node.service import NodeService

    root = Path(tempfile.mkdtemp(prefix="rsprobe-", dir=work))  # short: the daemon's unix socket lives under it
    try:
        node = NodeService(NodeConfig(store=str(store), root=root.absolute(), lowers={"materialize_after": 0}))
        node.start()
        try:
            t0 = time.perf_counter()
            created = node.create({"name": "probe", "groups": list(groups), "workdir": workdir,
                                   "fetch": {"background": False}})
            try:
                res = node.exec(created.id, ExecRequest(argv=["/bin/sh", "-c", command], timeout=timeout))
            finally:
                node.destroy(created.id, wait=True)  # the trace is published when the env ends
            seconds = time.perf_counter() - t0
            lazy = node.stages.lazy
            deadline = time.monotonic() + publish_wait
            published = 0
            while time.monotonic() < deadline:
                st = lazy.stats()
                published = int(st.get("shared_traces_published", 0))
                if published or st.get("shared_trace_publish_errors", 0):
                    break
                time.sleep(0.1)
            if not published:
                raise RuntimeFailure(f"the probe's access trace was not published within {publish_wait:.0f}s")
            stack = getattr(created, "stack_digest", None) or ""
            return {"exit_code": res.exit_code, "seconds": round(seconds, 3), "published": published,
                    "trace_key": f"{stack}/stack" if stack else None,
                    "output": ((res.stdout or "") + (res.stderr or ""))[-500:]}
        finally:
            node.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
