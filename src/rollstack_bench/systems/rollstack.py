"""rollstack's side of the side-by-side benchmarks: a node reading the bench registry over the link.

`RollstackSystem` is the counterpart of the containerd baselines (`rollstack_bench.systems.baselines`): a
`rollstack.client.local.Node` whose artifact store is the docker-registry inside the shaped link's
namespace, so rollstack pulls its layers over exactly the link the baselines pull images over.
`rollstack-eager` is the same node with plans saying `fetch: {eager: true}` (the whole stack is
fetched before the environment starts); `rollstack` fetches on demand (background fill off: on
this 2-core machine it competes with the workload, docs/demo.md).

Cold = node stopped, its lazy store state (chunk cache, TOCs, traces) and resolve cache removed,
page cache dropped, node started again; warm = everything kept. Also here: publishing the corpus's
groups into the bench registry (cached per corpus build) and the shared value types of a creation.
"""

from __future__ import annotations

import contextlib
import fcntl
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rollstack_bench.systems.baselines import InitTiming
from rollstack_bench.systems.containerd import drop_page_cache
from rollstack.errors import InvalidRequest

Log = Callable[[str], None]
SYSTEM_NAMES = ("docker-equivalent", "dynamic-assembly", "rollstack-eager", "rollstack")
ROLLSTACK_SYSTEMS = {"rollstack-eager": True, "rollstack": False}
"""rollstack system name -> eager fetch"""
FETCH_DETAIL = ("stall_seconds", "fetched_bytes", "critical_path_bytes", "prefetch_bytes", "from_cache_bytes",
                "reads", "trace_source")
"""What `Creation.fetch_detail` keeps of the lazy store's environment account (lazystore/envs.py)."""


@dataclass
class Creation:
    """One environment creation, measured the same way for every system."""

    system: str
    cold: bool
    ready_s: float
    """request -> environment ready to run commands"""
    first_cmd_s: float
    """request -> first command completed"""
    fetched_bytes: int
    """bytes received over the link from request to ready (baselines: their whole pull)"""
    link_bytes: int
    """bytes received over the link from request to first command done (HTTP overhead included)"""
    exit_code: int
    phases: dict[str, float] = field(default_factory=dict)
    output: str = ""
    node_fetched_bytes: int = -1
    """rollstack only: the node's own `fetch.fetched_bytes` (eager mode's full fetch is not in it)"""
    fuse_lowers: bool = False
    """rollstack, warm: the environment stacked FUSE directories (its layers not materialized yet)"""
    trace_prefetch_chunks: int = -1
    """rollstack: chunks prefetched from an access trace at create (0: none found, a first-ever start)"""
    fetch_detail: dict[str, Any] = field(default_factory=dict)
    """rollstack: the lazy store's account of the environment after its first command (FETCH_DETAIL:
    where a cold start's time goes, e.g. stall_seconds spent waiting for chunks)"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_baseline(cls, t: InitTiming, cold: bool) -> "Creation":
        # A baseline is ready only after its pull: every byte it received was fetched before ready.
        return cls(t.system, cold, t.ready_s, t.first_cmd_s, t.bytes_pulled, t.bytes_pulled, t.exit_code,
                   dict(t.phases), t.output[-500:])


def import_name(repo: str) -> str:
    """The Python package a corpus repository provides (more-itertools -> more_itertools)."""
    return repo.replace("-", "_")


def first_command(workdir: str, repo: str) -> list[str]:
    """The first command of every environment, the same for every system."""
    return ["/bin/sh", "-c", f"cd {shlex.quote(workdir)} && python3 -c 'import {import_name(repo)}, pytest'"]


@contextlib.contextmanager
def work_lock(work: Path) -> Iterator[None]:
    """One bench run per work dir (its containerd, registry data and node roots are not shareable)."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidRequest(f"another bench run is using {work} (pass another --work)") from None
        yield


# -- publishing the corpus into the bench registry ---------------------------------------------

def publish_components(corpus_root: Path, components: Sequence[str], store_url: str, cache_key: str,
                       cache_path: Path, scratch: Path, log: Log) -> list[dict[str, Any]]:
    """Publish the named corpus components as layer groups into `store_url` (cached by build)."""
    from rollstack_corpus.cache import ensure_corpus, LoadedCorpus
    from rollstack_corpus.publish import publish_corpus_groups
    from rollstack.store import open_store

    full = ensure_corpus(corpus_root, False, log)
    wanted = set(components)
    sub = LoadedCorpus(full.root, {**full.manifest, "components": [c for c in full.manifest["components"]
                                                                 if c["name"] in wanted]}, full.tasks, 0.0)
    store = open_store(store_url)
    try:
        published = publish_corpus_groups(sub, store, cache_key, cache_path, scratch, log)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return [p.to_dict() for p in published]


def forget_shared_traces(registry_data: Path) -> bool:
    """Remove every access trace nodes published to the bench registry (its filesystem storage;
    docker-registry keeps no cache of it here), so the next cold start is a first-ever one."""
    from rollstack.fetch.shared_traces import REPO

    repo = registry_data / "docker" / "registry" / "v2" / "repositories" / REPO
    existed = repo.is_dir()
    shutil.rmtree(repo, ignore_errors=True)
    return existed


def seed_layer_cache(mine: Path, other: Path) -> None:
    """Hard-link another bench work dir's gzip layers into ours (content-addressed: never rewritten)."""
    for sub in ("layers", "layer-meta"):
        src, dst = other / sub, mine / sub
        if src.is_dir() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-al", str(src), str(dst)], check=False, capture_output=True)


def on_fuse_lowers(env_id: str, mountinfo: str | None = None) -> bool:
    """Whether the environment's overlay stacks the lazy store's FUSE directories (some layer not
    materialized yet); `mountinfo`: a /proc/self/mountinfo text read once for many environments."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    line = next((ln for ln in text.splitlines() if f"envs/{env_id}" in ln and " overlay " in ln), "")
    return "lazy/mnt" in line


# -- the node -----------------------------------------------------------------------------------

class RollstackSystem:
    """A node (in this process) on the bench registry; `create()` measures one environment."""

    def __init__(self, name: str, store_url: str, root: Path, link: Any = None, **node_config: Any) -> None:
        if name not in ROLLSTACK_SYSTEMS:
            raise ValueError(f"not a rollstack system: {name}")
        self.name, self.eager = name, ROLLSTACK_SYSTEMS[name]
        self.store_url, self.root, self.link = store_url, root, link
        self.node_config = node_config
        self.node: Any = None

    # lifecycle
    def start(self) -> None:
        from rollstack.client.local import Node

        if self.node is None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.node = Node(store=self.store_url, root=self.root, **self.node_config)

    def stop(self) -> None:
        if self.node is not None:
            node, self.node = self.node, None
            node.close()

    def __enter__(self) -> "RollstackSystem":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _env_stats(self, env_id: str) -> dict[str, Any]:
        try:
            return dict(self.node.service.stages.lazy.env_stats(env_id) or {})
        except Exception:  # noqa: BLE001 - a statistic only
            return {}

    def settle(self, timeout: float = 600.0) -> bool:
        """Wait until the node has mounted its used layers' EROFS images (`lowers.erofs`) and
        materialized the layers it found hot (`lowers.materialize`)."""
        stages = self.node.service.stages if self.node is not None else None
        lowers = stages.lowers if stages is not None else None
        return lowers is None or lowers.wait_idle(timeout)

    def clear(self) -> None:
        """Cold start: stop the node, forget every cached chunk/TOC/trace/tag, drop the page cache."""
        self.stop()
        for d in (self.root / "lazy" / "state", self.root / "resolve-cache", self.root / "layers", self.root / "erofs"):
            shutil.rmtree(d, ignore_errors=True)
        drop_page_cache()
        self.start()

    # measurement
    def plan(self, plan: dict[str, Any]) -> dict[str, Any]:
        """The plan as this system runs it (eager: whole stack before launch; never background fill)."""
        out = dict(plan)
        out["fetch"] = {"eager": self.eager, "background": False}
        return out

    def create(self, plan: dict[str, Any], cmd: Sequence[str], cold: bool) -> Creation:
        """Create an environment, run `cmd` in it, destroy it; the timings of the first two."""
        assert self.node is not None, "start() first"
        rx0 = self.link.rx_bytes() if self.link is not None else 0
        t0 = time.perf_counter()
        env = self.node.create(self.plan(plan))
        try:
            ready = time.perf_counter() - t0
            # The link's counter is the instrument every system is measured with (the node's
            # `fetched_bytes` leaves out eager mode's full fetch and the TOCs).
            rx_ready = (self.link.rx_bytes() - rx0) if self.link is not None else -1
            res = env.exec(list(cmd), timeout=600)
            done = time.perf_counter() - t0
            # read after the command: the lazy store looks shared traces up in the background,
            # so the prefetch's size is known only once that lookup answered
            stats = self._env_stats(env.id)
            traced = int(stats.get("trace_prefetch_chunks", 0)) if stats else -1
            created = env.created
            phases = {k: float(v) for k, v in created.timings.model_dump().items() if isinstance(v, (int, float))}
            fetch = created.fetch
            phases["first_cmd"] = done - ready
            link = (self.link.rx_bytes() - rx0) if self.link is not None else 0
            fetched = rx_ready if rx_ready >= 0 else int(fetch.fetched_bytes)
            return Creation(self.name, cold, ready, done, fetched, link, res.exit_code, phases,
                            ((res.stdout or "") + (res.stderr or ""))[-500:], int(fetch.fetched_bytes),
                            trace_prefetch_chunks=traced,
                            fetch_detail={k: stats[k] for k in FETCH_DETAIL if k in stats})
        finally:
            env.destroy()
