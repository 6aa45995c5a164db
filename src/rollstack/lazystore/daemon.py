"""The lazy layer store daemon process (one per node).

    python -m rollstack.lazystore.daemon CONFIG_JSON      # one DaemonConfig document (lazystore/config.py)
    python -m rollstack.lazystore.daemon -                # the same document on stdin

`LazyStoreClient.start(config)` runs the first form. The document is validated before anything
else happens: a bad one (unknown field, a socket path over the unix limit, ...) exits with status
2 and one `error:` line, and nothing is mounted.

Mounts one read-only FUSE filesystem at the config's mountpoint (clearing a dead predecessor's
stale mount first), or, when an fd-holder (lazystore/holder.py) keeps a dead predecessor's
connection, takes that over, serves the control API on a unix socket (default
<state_dir>/control.sock) and optionally on TCP (for peers), and runs until SIGTERM/SIGINT or
`POST /v1/shutdown`, then unmounts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any, Sequence

import pydantic
import pyfuse3
import trio

from rollstack.lazystore import control, holder
from rollstack.lazystore.config import DaemonConfig
from rollstack.lazystore.fs import PATCH_LEVEL
from rollstack.lazystore.priority import raise_fuse_thread_priority
from rollstack.lazystore.recovery import clear_stale, lazy_unmount, mounted_at
from rollstack.lazystore.service import LazyStoreService
from rollstack.lazystore.shiftfs import ShiftingLazyFS

log = logging.getLogger("rollstack.lazystore.daemon")

FUSE_OPTIONS = ("fsname=rollstack", "subtype=rollstack", "ro", "allow_other", "default_permissions")


def parse_config(argv: Sequence[str]) -> DaemonConfig:
    """The DaemonConfig of the command line (`CONFIG_JSON` or `-` for stdin); ValidationError
    or SystemExit(2) on a bad one."""
    if len(argv) != 1:
        raise SystemExit("usage: python -m rollstack.lazystore.daemon CONFIG_JSON|-")
    text = sys.stdin.read() if argv[0] == "-" else argv[0]
    return DaemonConfig.model_validate_json(text)


def run(config: DaemonConfig, store: Any, decode: Any = None) -> None:
    """Blocking: mount (or take the connection over from the fd-holder), serve, unmount.
    `store` is any ArtifactStore."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    handover = config.holder_grace > 0 and PATCH_LEVEL >= 2
    taken = holder.take(config.state_dir) if handover else None
    service = LazyStoreService(config, store, decode=decode)
    fs = ShiftingLazyFS(service)  # LazyFS plus /shifted for user-namespaced environments
    service.attach(fs)
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
        service.layers.forget_record()
        pyfuse3.init(fs, str(config.mountpoint), set(FUSE_OPTIONS))
        if handover:
            owner = holder.spawn(config.state_dir, pyfuse3.connection_fd(), config.holder_grace)
        elif config.holder_grace > 0:
            log.warning("no fd-holder: pyfuse3 lacks the rollstack patch (level 2); a restart will break "
                        "running environments' uncached reads")
    fs.note_mode(takeover=taken is not None, fd_holder=owner is not None,
                 fuse_priority=raise_fuse_thread_priority(config.fuse_priority))
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
            restored = await service.layers.restore()
            log.info("restored %d layers in %.3fs", len(restored["layers"]), restored["seconds"])
            holder.resend_pending(taken_fd)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_signals, shutdown)
            await nursery.start(control.serve, listeners, api.handle)
            await trio.to_thread.run_sync((config.state_dir / "daemon.pid").write_text, str(os.getpid()))
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
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except pydantic.ValidationError as exc:
        print(f"error: bad lazy store daemon config: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from rollstack.store import open_store

    # the fetcher owns retries and the read deadline; the client only retries briefly
    options = {"retries": 2, "timeout": 10.0} if config.store.startswith(("http://", "https://")) else {}
    run(config, open_store(config.store, **options))


if __name__ == "__main__":
    main()
