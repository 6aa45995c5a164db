"""The lazy layer store daemon process (one per node).

    python -m rollstack.mount.daemon --mountpoint M --state-dir D --store S
        [--cache-budget BYTES] [--memory-budget BYTES] [--peer URL ...]
        [--control unix:SOCK] [--listen 127.0.0.1:PORT] [--deadline SECONDS]
        [--background-grace S] [--background-quiet S] [--background-share F] [--link-rate BYTES/S]
        [--dir-prefetch-bytes BYTES] [--writeback-quiet S]
        [--fetch-on-open] [--neighbor-same-dir] [--no-share-traces] [--kernel-open]
        [--holder-grace S]

Mounts one read-only FUSE filesystem at M (clearing a dead predecessor's stale mount first), or,
when an fd-holder (mount/holder.py) keeps a dead predecessor's connection, takes that over,
serves the control API on a unix socket (default D/control.sock) and optionally on TCP (for
peers), and runs until SIGTERM/SIGINT or `POST /v1/shutdown`, then unmounts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

import pyfuse3
import trio

from rollstack.fetch import FetchConfig
from rollstack.mount import control, holder
from rollstack.mount.fs import PATCH_LEVEL
from rollstack.mount.priority import raise_fuse_thread_priority
from rollstack.mount.recovery import clear_stale, lazy_unmount, mounted_at
from rollstack.mount.shiftfs import ShiftingLazyFS
from rollstack.mount.service import DaemonConfig, LazyStoreService

log = logging.getLogger("rollstack.mount.daemon")

FUSE_OPTIONS = ("fsname=rollstack", "subtype=rollstack", "ro", "allow_other", "default_permissions")


def parse_args(argv: Sequence[str] | None = None) -> DaemonConfig:
    p = argparse.ArgumentParser(prog="rollstack.mount.daemon", description=__doc__.split("\n\n")[0])
    p.add_argument("--mountpoint", required=True, type=Path)
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--store", required=True)
    p.add_argument("--cache-budget", type=int, default=FetchConfig.disk_budget)
    p.add_argument("--memory-budget", type=int, default=FetchConfig.memory_budget)
    p.add_argument("--peer", action="append", default=[])
    p.add_argument("--control", default=None, help="unix:PATH of the control socket")
    p.add_argument("--listen", default=None, help="also serve the API on TCP HOST:PORT (for peers)")
    p.add_argument("--deadline", type=float, default=FetchConfig.deadline)
    p.add_argument("--neighbor-bytes", type=int, default=FetchConfig.neighbor_bytes)
    p.add_argument("--neighbor-back-bytes", type=int, default=FetchConfig.neighbor_back_bytes)
    p.add_argument("--dir-prefetch-bytes", type=int, default=FetchConfig.dir_prefetch_bytes,
                   help="on a registry miss, prefetch this many stored bytes of the directory's small files (0: off)")
    p.add_argument("--writeback-quiet", type=float, default=FetchConfig.writeback_quiet,
                   help="seconds of foreground quiet before fetched chunks are written to the disk cache (0: at once)")
    p.add_argument("--trace-window", type=float, default=FetchConfig.trace_window)
    p.add_argument("--background-grace", type=float, default=FetchConfig.background_grace)
    p.add_argument("--background-quiet", type=float, default=FetchConfig.background_quiet)
    p.add_argument("--background-share", type=float, default=FetchConfig.background_share)
    p.add_argument("--link-rate", type=float, default=FetchConfig.link_rate, help="bytes/s to the registry")
    p.add_argument("--neighbor-same-dir", action="store_true", default=FetchConfig.neighbor_same_dir,
                   help="neighbour windows stay inside the missed file's parent directory subtree")
    p.add_argument("--fetch-on-open", action="store_true", default=FetchConfig.fetch_on_open,
                   help="start a file's first fetch at open(), not at its first read")
    p.add_argument("--no-share-traces", dest="share_traces", action="store_false", default=True,
                   help="neither publish access traces to the store nor look them up there")
    p.add_argument("--holder-grace", type=float, default=DaemonConfig.holder_grace,
                   help="seconds the fd-holder keeps the FUSE connection for a successor after this "
                        "daemon dies (0: no holder; a death then aborts the connection at once)")
    p.add_argument("--kernel-open", dest="no_open", action="store_false", default=True,
                   help="serve OPEN/RELEASE/OPENDIR requests (default: no-open mode with the patched pyfuse3)")
    p.add_argument("--fuse-priority", choices=("rr", "nice", "normal"),
                   default=os.environ.get("ROLLSTACK_FUSE_PRIORITY", DaemonConfig.fuse_priority),
                   help="CPU priority of the thread serving FUSE (mount/priority.py; default $ROLLSTACK_FUSE_PRIORITY or rr)")
    a = p.parse_args(argv)
    ctl = Path(a.control.removeprefix("unix:")) if a.control else None
    fetch = FetchConfig(memory_budget=a.memory_budget, disk_budget=a.cache_budget, deadline=a.deadline,
                        neighbor_bytes=a.neighbor_bytes, neighbor_back_bytes=a.neighbor_back_bytes,
                        dir_prefetch_bytes=a.dir_prefetch_bytes, writeback_quiet=a.writeback_quiet,
                        trace_window=a.trace_window, background_grace=a.background_grace,
                        background_quiet=a.background_quiet, background_share=a.background_share,
                        link_rate=a.link_rate, fetch_on_open=a.fetch_on_open,
                        neighbor_same_dir=a.neighbor_same_dir)
    return DaemonConfig(mountpoint=a.mountpoint.absolute(), state_dir=a.state_dir.absolute(), store=a.store,
                        fetch=fetch, peers=tuple(a.peer), control=ctl, listen=a.listen,
                        share_traces=a.share_traces, no_open=a.no_open, holder_grace=a.holder_grace,
                        fuse_priority=a.fuse_priority)


def run(config: DaemonConfig, store: Any, decode: Any = None) -> None:
    """Blocking: mount (or take the connection over from the fd-holder), serve, unmount.
    `store` is any ArtifactStore."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    handover = config.holder_grace > 0 and PATCH_LEVEL >= 2
    taken = holder.take(config.state_dir) if handover else None
    service = LazyStoreService(config, store, decode=decode)
    fs = ShiftingLazyFS(service)  # LazyFS plus /shifted for user-namespaced environments
    owner = None
    if taken is not None:
        fd, owner = taken
        log.warning("taking over the FUSE connection at %s from the fd-holder", config.mountpoint)
        pyfuse3.init(fs, f"/dev/fd/{fd}", set(FUSE_OPTIONS))
        pyfuse3.assume_init(holder.init_request())  # the kernel sent INIT to our predecessor
    else:
        config.mountpoint.mkdir(parents=True, exist_ok=True)
        if clear_stale(config.mountpoint):
            log.warning("removed a stale mount at %s (a previous daemon died)", config.mountpoint)
        if mounted_at(config.mountpoint) is not None:
            raise SystemExit(f"{config.mountpoint} is already mounted (is another daemon running?)")
        service.forget_recorded_layers()
        pyfuse3.init(fs, str(config.mountpoint), set(FUSE_OPTIONS))
        if handover:
            owner = holder.spawn(config.state_dir, pyfuse3.connection_fd(), config.holder_grace)
        elif config.holder_grace > 0:
            log.warning("no fd-holder: pyfuse3 lacks the rollstack patch (level 2); a restart will break "
                        "running environments' uncached reads")
    service.fs_mode["takeover"] = taken is not None
    service.fs_mode["fd_holder"] = owner is not None
    service.fs_mode["fuse_priority"] = raise_fuse_thread_priority(config.fuse_priority)
    stopped = False
    try:
        trio.run(_main, service, taken[0] if taken else None)
        stopped = True
    finally:
        if owner is not None and not stopped:
            # a failure, not a stop: the holder keeps the connection for a successor
            log.error("daemon failed: the fd-holder keeps %s for a successor", config.mountpoint)
            pyfuse3.close(unmount=False)
        else:
            if owner is not None:
                holder.release(owner)  # stopping on purpose: the connection ends with the unmount
            pyfuse3.close(unmount=taken is None)  # libfuse did not mount a /dev/fd/N session
            if taken is not None:
                lazy_unmount(config.mountpoint)
            log.info("unmounted %s", config.mountpoint)


async def _main(service: LazyStoreService, taken_fd: int | None = None) -> None:
    config = service.config

    def shutdown() -> None:
        pyfuse3.terminate()

    api = control.ControlApi(service, shutdown)
    listeners = [await control.unix_listener(config.control_socket)]
    if config.listen:
        listeners.append(await control.tcp_listener(config.listen))
    async with service.fetcher.running():
        if taken_fd is not None:
            # the kernel holds inode numbers of our predecessor's layers: load them at the same
            # bases before the first request is read, then have the requests it had read but
            # not answered queued again
            restored = await service.restore_layers()
            log.info("restored %d layers in %.3fs", len(restored["layers"]), restored["seconds"])
            holder.resend_pending(taken_fd)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_signals, shutdown)
            await nursery.start(control.serve, listeners, api.handle)
            (config.state_dir / "daemon.pid").write_text(str(os.getpid()))
            log.info("serving %s (control %s)", config.mountpoint, config.control_socket)
            await pyfuse3.main(max_tasks=128)
            nursery.cancel_scope.cancel()
    try:
        config.control_socket.unlink()
    except FileNotFoundError:
        pass


async def _signals(shutdown: Any) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            shutdown()
            return


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=os.environ.get("ROLLSTACK_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = parse_args(argv)
    from rollstack.store import open_store

    # the fetcher owns retries and the read deadline; the client only retries briefly
    options = {"retries": 2, "timeout": 10.0} if config.store.startswith(("http://", "https://")) else {}
    run(config, open_store(config.store, **options))


if __name__ == "__main__":
    main()
