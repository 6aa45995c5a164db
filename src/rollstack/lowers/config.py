"""`LowersConfig`: how a node turns layers into lower dirs (`NodeConfig.lowers`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LowersConfig(BaseModel):
    """Which faster lower a layer may get besides its lazy-store FUSE directory, and when."""

    model_config = ConfigDict(extra="forbid")

    materialize_after: int = Field(default=2, ge=0)
    """A layer used by this many environments is copied out of the lazy store into a local
    directory that later environments stack instead (no FUSE round trips); 0 = never."""
    materialize_budget: int = 32 << 30
    """Bytes of materialized layers kept (least recently used, unmounted ones go first)."""
    materialize_min_free: int = 8 << 30
    """No layer is materialized while the node's filesystem has less than this free."""
    materialize_cpu: float = Field(default=1.0, ge=0)
    """Cores the materializer's extraction may use at most (its cgroup's CFS quota, beside its
    SCHED_IDLE priority and the lowest share; host.background); 0 = no cap. One core: the
    extraction is single-threaded, so the cap only guarantees it never takes more; a lower cap
    slows materialization (0.5: 1.5-1.8x longer) without a measured gain on a quiet node
    (docs/benchmarks.md, `bench materialize`)."""
    materialize_min_idle: float = Field(default=0.5, ge=0)
    """Idle cores (over 0.2 s, /proc/stat) the extraction waits for before each read: what it
    causes at normal priority (the network stack, disk flushes, a registry on the node) waits
    for running environments too (host.cpuidle); 0 = do not wait."""
    erofs: bool = True
    """Once an environment has used a layer, later ones stack it as an in-kernel EROFS mount
    over the lazy store's blob of the layer (lowers/erofs.py): native-speed metadata, data still
    fetched on first read. Needs Linux >= 6.12 (file-backed EROFS); ignored without it."""
    erofs_grace: float = Field(default=1.0, ge=0)
    """Seconds after a layer's first use before a build nobody waits for starts: a lone cold
    start keeps both cores (measured on a 2.3 GB, 62k-entry layer: a build at once cost its
    cold start ~0.5 s). A create that waits for the build (`erofs_wait`: a group, a sibling of
    the same wave) ends the grace at once, so a GRPO wave still starts on EROFS lowers."""
    erofs_min_idle: float = Field(default=0.0, ge=0)
    """Idle cores a background EROFS build waits for first (at most 5 s); 0 = do not wait."""
    erofs_wait: float = Field(default=2.0, ge=0)
    """Seconds a create may wait for its layers' EROFS mounts (lowers/erofs.py): a GRPO group
    (`count` > 1), and a create whose layers' build another create already started, wait for
    it; the first create of a stack on the node never does, unless its layers' images were
    published beside the group (then it waits for a fetch, not a build). 0 = never wait."""
    erofs_published: bool = True
    """Use the EROFS images `group publish`/`group import` publish beside a group's layers
    (plan/lowers.py): fetched and checked instead of built, so even the first environment of
    a stack on a node starts on EROFS lowers. False: every node builds its own."""


LEGACY_KEYS = {name: name for name in LowersConfig.model_fields if name != "erofs"} | {"erofs_lowers": "erofs"}
"""NodeConfig's flat keys before the lowers moved into their own section -> their name in it
(a node config file written before still loads: `NodeConfig` moves them into `lowers`)."""
