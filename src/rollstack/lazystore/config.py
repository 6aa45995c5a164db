"""`DaemonConfig`: the lazy store daemon's whole configuration, as one pydantic document.

    LazyStoreSettings   how the store behaves: `fetch` (FetchConfig, the chunk data path), peers,
                        TCP listen address, kernel caching, trace sharing, FUSE modes. The node
                        agent embeds it as `NodeConfig.lazy`.
    DaemonConfig        the settings plus where the daemon runs: mountpoint, state directory,
                        artifact store.

`LazyStoreClient.start(config)` hands the daemon `config.model_dump_json()` as its one argument
(the node agent is started the same way, node/agent.py); `python -m rollstack.lazystore.daemon`
validates it with this model. No field is spelled anywhere else.

Unix sockets have a 108-byte path limit (`sun_path`, NUL included): a state directory whose
control or fd-holder socket path does not fit is refused here, before anything is mounted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollstack.fetch.config import FetchConfig
from rollstack.lazystore.holder import socket_path as holder_socket

SUN_PATH_MAX = 107  # bytes of a unix socket path (sun_path is 108 bytes with the NUL)


class LazyStoreSettings(BaseModel):
    """How the lazy store behaves, independent of where it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    fetch: FetchConfig = Field(default_factory=FetchConfig)
    """The chunk data path: caches, request sizes, prefetch, background fill, deadlines."""
    peers: tuple[str, ...] = ()
    """Peer daemons' URLs, asked for a chunk before the registry."""
    listen: str | None = None
    """Optional TCP address (127.0.0.1:PORT) serving the same API, for peers."""
    entry_timeout: float = 86400.0
    """Seconds the kernel may cache entries, attributes and negative lookups of layer content."""
    share_traces: bool = True
    """Publish new access traces to the artifact store and look them up on a local miss."""
    no_open: bool = True
    """Answer the first OPEN and OPENDIR with ENOSYS, so the kernel stops sending OPEN, RELEASE,
    OPENDIR and RELEASEDIR and caches directory listings (needs the patched pyfuse3,
    third_party/pyfuse3; without it the daemon serves opens as before)."""
    holder_grace: float = 30.0
    """Seconds an fd-holder process keeps the FUSE connection alive for a successor after the
    daemon dies (lazystore/holder.py); 0: no holder."""
    fuse_priority: Literal["rr", "nice", "normal"] = Field(
        default_factory=lambda: os.environ.get("ROLLSTACK_FUSE_PRIORITY", "rr"))
    """CPU priority of the thread serving FUSE: rr | nice | normal (lazystore/priority.py; default
    $ROLLSTACK_FUSE_PRIORITY, else rr)."""
    fuse_linger_us: int = Field(
        default_factory=lambda: int(os.environ.get("ROLLSTACK_FUSE_LINGER_US", "100")), ge=0, le=10_000)
    """After a request answered in C (the xattr fast path), microseconds to wait for the next
    one before returning to the event loop (patched pyfuse3 level 4; 0: do not wait; default
    $ROLLSTACK_FUSE_LINGER_US, else 100). A new overlay mount probes every lower inode it meets
    once, one synchronous request after another: waiting for the next probe is cheaper than a
    trip through trio (docs/lazy-store.md)."""


class DaemonConfig(LazyStoreSettings):
    """A lazy store daemon: the settings plus its mountpoint, state directory and store."""

    mountpoint: Path
    state_dir: Path
    store: str
    """Artifact store spec (`oci:PATH`, a path, `http(s)://host:port`)."""
    control: Path | None = None
    """Unix socket of the control API (default: <state_dir>/control.sock)."""

    @field_validator("mountpoint", "state_dir", "control")
    @classmethod
    def _absolute(cls, p: Path | None) -> Path | None:
        return p.absolute() if p is not None else None

    @model_validator(mode="after")
    def _sockets_fit(self) -> "DaemonConfig":
        for sock in (self.control_socket, holder_socket(self.state_dir)):
            n = len(os.fsencode(str(sock)))
            if n > SUN_PATH_MAX:
                raise ValueError(f"unix socket path {str(sock)!r} is {n} bytes, more than the {SUN_PATH_MAX} "
                                 "a unix socket allows: use a shorter state directory")
        return self

    @property
    def control_socket(self) -> Path:
        return self.control or self.state_dir / "control.sock"

    @classmethod
    def of(cls, mountpoint: str | os.PathLike[str], state_dir: str | os.PathLike[str], store: str,
           settings: LazyStoreSettings | None = None, **changes: Any) -> "DaemonConfig":
        """A daemon at these paths with `settings` (default: the defaults), then `changes`: any
        field of DaemonConfig or of FetchConfig by name (`neighbor_bytes=0, holder_grace=60`)."""
        doc = (settings or LazyStoreSettings()).model_dump()
        fetch = doc["fetch"]
        for name, value in changes.items():
            if name in FetchConfig.model_fields:
                fetch[name] = value
            elif name in cls.model_fields and name != "fetch":
                doc[name] = value
            else:
                raise TypeError(f"DaemonConfig.of: no field {name!r} in DaemonConfig or FetchConfig")
        return cls(mountpoint=mountpoint, state_dir=state_dir, store=store, **doc)


DAEMON_MODULE = "rollstack.lazystore.daemon"


def daemon_argv(python: str, config: DaemonConfig) -> list[str]:
    """The command line of a daemon with `config` (its one argument: the JSON document)."""
    return [python, "-m", DAEMON_MODULE, config.model_dump_json()]


def daemon_pids(mountpoint: str | os.PathLike[str]) -> list[int]:
    """Pids of lazy store daemons serving `mountpoint` (found by the config on their command line)."""
    from rollstack.lazystore.recovery import processes

    want = Path(mountpoint).absolute()
    pids = []
    for pid, argv in processes():
        if DAEMON_MODULE.encode() not in argv:
            continue
        doc = argv[argv.index(DAEMON_MODULE.encode()) + 1:][:1]
        try:
            config = DaemonConfig.model_validate_json(doc[0]) if doc else None
        except ValueError:  # not a config document (e.g. --help): not serving anything
            continue
        if config is not None and config.mountpoint == want:
            pids.append(pid)
    return pids
