"""`NodeConfig`: everything a node agent is configured with, as one explicit value object."""

from __future__ import annotations

from pathlib import Path

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollstack.fetch.config import FetchConfig
from rollstack.lazystore.config import LazyStoreSettings
from rollstack.lowers.config import LEGACY_KEYS, LowersConfig

DEFAULT_ROOT = Path("/var/lib/rollstack")
DEFAULT_LISTEN = "127.0.0.1:7878"


class NodeConfig(BaseModel):
    """A node agent's configuration (all paths on the node's local disk)."""

    model_config = ConfigDict(extra="forbid")

    root: Path = DEFAULT_ROOT
    """State directory: environments (upper/work dirs, bundles), the lazy store's mountpoint and
    caches, runc state, pid and token files. Everything the agent leaves is under it."""
    store: str | None = None
    """Artifact store spec (`oci:PATH`, a path, `http(s)://host:port`); None: $ROLLSTACK_STORE or the default."""
    listen: str = DEFAULT_LISTEN
    """host:port the HTTP API binds to."""
    token_file: Path | None = None
    """Bearer token file (default `<root>/token`)."""
    max_environments: int = Field(default=128, ge=1)
    """Admission: more live environments than this are refused with insufficient_capacity."""
    capacity_cpu: float | None = None
    """Cores the provisioner may hand out (default: the machine's)."""
    capacity_memory: int | None = None
    """Bytes the provisioner may hand out (default: the machine's RAM minus `reserve_memory`)."""
    reserve_memory: int = 1 << 30
    """Bytes kept back for the host and the agent itself."""
    fork_memory: int = Field(default=2 << 30, ge=0)
    """Bytes of the tmpfs that holds small fork layers (`<root>/forks/mem`; 0: all on disk). Memory
    is used only by the layers in it, while children stack them (docs/fork.md)."""
    default_timeout: float = Field(default=3600.0, gt=0)
    """Seconds an environment lives when its plan sets no timeout."""
    reap_interval: float = Field(default=5.0, gt=0)
    """Seconds between sweeps for expired environments (past their lifetime, or whose lease
    lapsed) and for retries of failed teardowns."""
    paused_ttl: float = Field(default=86400.0, gt=0)
    """Seconds an environment the reaper paused at its timeout (`on_timeout: pause`, E2B's
    autoPause) stays paused before it is destroyed (frozen processes keep their memory)."""
    idempotency_ttl: float = Field(default=600.0, gt=0)
    """Seconds a create's `Idempotency-Key` keeps answering with the same environment(s)."""
    idempotency_keys: int = Field(default=65536, ge=1)
    """Most keys remembered (the oldest finished ones are forgotten first)."""
    destroy_retry_max: float = Field(default=60.0, gt=0)
    """Longest wait between retries of a failed teardown (the wait doubles from 1 s up to it)."""
    resolve_ttl: float = 300.0
    """Seconds a resolved tag stays cached."""
    lowers: LowersConfig = Field(default_factory=LowersConfig)
    """How layers become lower dirs (rollstack.lowers): materialized local copies, EROFS mounts
    over the lazy store's blobs, else the lazy store's FUSE directories."""
    lazy: LazyStoreSettings = Field(default_factory=lambda: LazyStoreSettings(fetch=FetchConfig(disk_budget=20 << 30)))
    """The lazy store daemon's settings (lazystore/config.py): `fetch` (its chunk data path; here
    with a 20 GiB disk chunk cache, `fetch.disk_budget`), `peers` (peer nodes' chunk endpoints,
    asked before the registry), `listen` (host:port on which it also serves its API over TCP,
    for peers; None: unix socket only), ... A `lazy` given replaces this default as a whole."""
    exec_output_limit: int = 16 << 20
    """Bytes of stdout (and of stderr) an exec keeps; past it the output is truncated and flagged."""
    max_file_bytes: int = Field(default=1 << 30, gt=0)
    """Largest file the files API reads or writes in one request."""
    adopt: bool = True
    """On start, re-adopt a crashed run's running environments when its lazy store daemon still
    serves them (otherwise, and always for evaluator environments, they are destroyed)."""
    async_destroy: bool = True
    """Destroy answers once the environment is released (admission, provisioner) and killed;
    runc delete, cgroup removal, unmount and dir removal follow on a background thread."""
    destroy_workers: int = Field(default=4, ge=1)
    """Threads doing background destroys."""
    exec_agent: bool = True
    """Run execs through each environment's PID 1 (rollstack-execd) instead of `runc exec`."""
    cpu_overcommit: float = Field(default=8.0, ge=1)
    """Admission: the sum of environments' CPU quotas may reach cores x this (see
    docs/provisioning.md, "Overcommit"). Memory is never overcommitted."""
    network_warm: int = Field(default=4, ge=0)
    """Network slots (netns + veth + a drop-all table) kept prepared once the first create asks
    for a network, so later ones only load their rules; 0: each is built during its create."""
    network_uplinks: list[str] = Field(default_factory=list)
    """The node's uplink interfaces (e.g. ["eth0"], `node start --uplink`): `outbound`/`allow`
    environments' replies are forwarded from them, so their per-interface forwarding is switched
    on (nothing else). Empty (the default): the interfaces the kernel routes each environment's
    destinations through, found at its create (run/network.py `NetworkManager.uplinks`)."""
    warm_pool: int = Field(default=0, ge=0)
    """Started sandboxes kept per layer stack and handed out at create (rollstack.node.warm;
    docs/node.md, "Warm pool"); 0: off, every create starts its container."""
    fork_warm: int = Field(default=8, ge=0)
    """Late-bound sandboxes kept for forks' children once the node has forked (rollstack.node.
    warm, rollstack.run.lateroot; docs/fork.md): a child takes one and gets its root switched in
    instead of a cold start; 0: off, every child starts its container."""
    fork_warm_max: int = Field(default=32, ge=0)
    """The late-bound pool grows to the largest fork the node serves, up to this many (a node
    forking 16 at a time keeps 16), and back to `fork_warm` 10 minutes after the last fork that
    large (rollstack.node.warm, GROWN_FOR); never below `fork_warm`."""
    warm_pool_max: int = Field(default=64, ge=1)
    """Warm sandboxes on the node in all (never more than max_environments minus live ones)."""
    warm_stacks: int = Field(default=4, ge=1)
    """Stacks with a warm pool (least recently used dropped first)."""
    warm_cpu_share: float = Field(default=0.5, gt=0, le=1)
    """Fraction of the time the refill thread may spend starting sandboxes."""
    provision: bool = True
    """Run the elastic provisioner (quota history, OOM handling); off only for tests."""

    @model_validator(mode="before")
    @classmethod
    def _nest_legacy_lowers(cls, data: Any) -> Any:
        """A config written before `lowers` had its section (flat `materialize_*`, `erofs_*`)."""
        if not isinstance(data, dict) or not LEGACY_KEYS.keys() & data.keys():
            return data
        data = dict(data)
        lowers = data.get("lowers")
        nested = lowers.model_dump() if isinstance(lowers, LowersConfig) else dict(lowers or {})
        for old, new in LEGACY_KEYS.items():
            if old in data:
                nested[new] = data.pop(old)
        data["lowers"] = nested
        return data

    @property
    def token_path(self) -> Path:
        return self.token_file or self.root / "token"

    @property
    def pid_path(self) -> Path:
        return self.root / "agent.pid"

    @property
    def envs_dir(self) -> Path:
        return self.root / "envs"

    @property
    def lazy_dir(self) -> Path:
        return self.root / "lazy"

    @property
    def materialized_dir(self) -> Path:
        return self.root / "layers"

    @property
    def resolve_cache(self) -> Path:
        return self.root / "resolve-cache"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def log_path(self) -> Path:
        return self.root / "agent.log"

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host or "127.0.0.1", int(port)

    def url(self) -> str:
        host, port = self.host_port()
        return f"http://{host}:{port}"
