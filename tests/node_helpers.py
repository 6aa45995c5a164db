"""Shared helpers of the node integration tests: the busybox corpus (from the env benchmark), a
node agent served on a loopback port (`serve_node`), and what a node could leave behind. The
`corpus` fixture is in conftest.py."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rollstack.node.forks import layer_names
from rollstack_bench.env import busybox_plan, publish_busybox_corpus

__all__ = ["plan", "publish_corpus", "leftovers", "remember", "serve_node"]


def plan(**overrides) -> dict:
    return busybox_plan(**overrides)


def publish_corpus(store_dir: Path, work: Path) -> str:
    return publish_busybox_corpus(store_dir, work)


@contextmanager
def serve_node(root: Path, store: str, token: str, **config: Any) -> Iterator[tuple[Any, Any]]:
    """A started `NodeService` under `root` (`NodeConfig(root, store, **config)`) with its HTTP
    API on a loopback port: (service, server). Stopped on exit, also on failure; after a clean
    exit the node must have left nothing under `root`, by our own count and `node doctor`'s."""
    from rollstack.node.api import create_app
    from rollstack.node.config import NodeConfig
    from rollstack.node.server import BackgroundServer
    from rollstack.node.service import NodeService

    service = NodeService(NodeConfig(root=root, store=store, **config))
    service.start()
    try:
        with BackgroundServer(create_app(service, token)) as server:
            yield service, server
    finally:
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)
    doctor_clean(root)


def doctor_clean(root: Path) -> None:
    """`rollstack node doctor` finds nothing left under `root` (the node is stopped)."""
    from rollstack.node.doctor import scan

    _, found = scan([root])
    assert not found, [f.to_dict() for f in found]


_IDS: dict[str, set[str]] = {}


def remember(root: Path, env_id: str) -> None:
    _IDS.setdefault(str(root), set()).add(env_id)


def pooled(service: Any, timeout: float = 120) -> set[str]:
    """The ids of the sandboxes `service`'s pools hold (the create warm pool's and the forks'
    late-bound one), once both are settled (nothing starting or being destroyed)."""
    ids: set[str] = set()
    for pool in (service.stages.warm, service.stages.late):
        if pool is not None:
            assert pool.wait_full(timeout), pool.stats()
            with pool._cond:
                ids |= {e.id for s in pool._pools.values() for e in s.ready + s.stale}
    return ids


def leftovers(root: Path, service: Any = None) -> dict[str, list[str]]:
    """Everything a node could leave under `root`: mounts, env dirs, runc state, and the cgroups
    of the environments the tests remembered (other tests share the host's rollstack/ parent).
    `service`: a running node's; its pools' sandboxes (`pooled`) are not leftovers."""
    keep = pooled(service) if service is not None else set()
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split(" ")[4]
            if mp.startswith(str(root / "envs")) and Path(mp).relative_to(root / "envs").parts[0] not in keep:
                mounts.append(mp)
    envs = sorted(p.name for p in (root / "envs").iterdir() if p.name not in keep) if (root / "envs").is_dir() else []
    runc_dir = root / "runc"
    runc = sorted(p.name for p in runc_dir.iterdir()
                  if p.is_dir() and not p.name.startswith("rs-exec-") and p.name not in keep) \
        if runc_dir.is_dir() else []
    ids = _IDS.get(str(root), set())
    cgroups = []
    for hier in Path("/sys/fs/cgroup").iterdir():
        parent = hier / "rollstack"
        if parent.is_dir():
            cgroups += [str(p) for p in parent.iterdir() if p.is_dir() and p.name in ids]
    records_dir = root / "node-envs"  # node.recovery.RECORDS_DIR: records and reserved tmps
    records = sorted(p.name for p in records_dir.iterdir() if not any(k in p.name for k in keep)) \
        if records_dir.is_dir() else []
    forks = layer_names(root / "forks")
    return {"mounts": mounts, "envs": envs, "runc": runc, "cgroups": cgroups, "records": records,
            "forks": forks}


def sh(env: Any, script: str, timeout: float = 120) -> str:
    """`/bin/sh -c script` in an SDK environment; its stdout (asserts exit 0)."""
    r = env.exec(["/bin/sh", "-c", script], timeout=timeout)
    assert r.exit_code == 0, (script, r.stdout, r.stderr)
    return r.stdout.decode() if isinstance(r.stdout, bytes) else r.stdout
