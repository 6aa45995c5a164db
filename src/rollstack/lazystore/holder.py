"""The fd-holder: keeps the node's FUSE connection alive across a daemon restart.

A FUSE connection lives as long as some process holds its `/dev/fuse` file descriptor. The
daemon that mounts hands a copy of that fd to this small process (SCM_RIGHTS over a unix socket
in the state directory) and stays connected to it. While the holder has the fd, the daemon's
death does not abort the connection: the kernel keeps new requests queued, and running
environments wait instead of failing.

    daemon A mounts ──OWN + fd──▶ holder            (A connected: holder idle)
    daemon A dies  ──EOF───────▶ holder             (grace timer starts; requests queue)
    daemon B       ──TAKE──────▶ holder ──fd──▶ B   (B is the owner now)
    B: libfuse on /dev/fd/N, assume_init, FUSE_NOTIFY_RESEND, serve

If no daemon takes over within `grace` seconds, the holder closes its copy: the kernel aborts
the connection, waiting requests fail with ENOTCONN, and the next daemon clears the stale mount
(recovery.py) as without a holder. A daemon that stops on purpose sends RELEASE first: the holder
closes its copy and exits, so the unmount ends the connection.

Protocol: one line each way; the fd travels with the holder's `FD` answer.
    OWN\\n (+ fd, from the mounting daemon)    -> OK\\n
    TAKE\\n                                    -> FD\\n (+ fd) | BUSY\\n (a live daemon owns it)
    PING\\n                                    -> PONG owned|orphaned\\n
    RELEASE\\n (from the owner)                -> the holder exits
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

log = logging.getLogger("rollstack.lazystore.holder")

SOCKET_NAME = "fuse-holder.sock"
DEFAULT_GRACE = 30.0
FUSE_NOTIFY_RESEND = 7  # linux/fuse.h, protocol 7.40 (Linux 6.9)
FUSE_INIT = 26
# the INIT flags offered to libfuse on a takeover (linux/fuse.h): pyfuse3 requires READDIRPLUS,
# MAX_PAGES keeps libfuse's 1 MiB receive buffer, EXPORT_SUPPORT and CACHE_SYMLINKS as at mount
_TAKEOVER_FLAGS = (1 << 4) | (1 << 13) | (1 << 22) | (1 << 23)
_TAKEOVER_UNIQUE = 1 << 62  # far above any id the kernel issues (counted up from 0): the reply is dropped


def socket_path(state_dir: Path) -> Path:
    return Path(state_dir) / SOCKET_NAME


# -- the holder process ----------------------------------------------------------------------
def serve(listener: socket.socket, fd: int, grace: float) -> socket.socket | None:
    """Hold `fd` until RELEASE, or until no daemon has owned it for `grace` seconds. Returns the
    releasing daemon's connection, still open: the process closes it by exiting (`main`), so the
    daemon's wait for EOF (`release`) ends only once this process is gone."""
    owner: socket.socket | None = None
    released = False
    orphaned_at: float | None = time.monotonic()  # until the mounting daemon says OWN
    try:
        while True:
            wait = None if orphaned_at is None else max(0.0, orphaned_at + grace - time.monotonic())
            ready, _, _ = select.select([listener] + ([owner] if owner else []), [], [], wait)
            if not ready:
                log.warning("no daemon took the FUSE connection over in %.0fs: closing it", grace)
                return
            if owner is not None and owner in ready:
                msg = _recv_line(owner)
                if msg == "RELEASE":
                    log.info("released by the daemon")
                    released = True
                    return owner
                owner.close()  # EOF (the daemon died) or garbage: wait for a successor
                owner, orphaned_at = None, time.monotonic()
                log.warning("daemon gone: holding the FUSE connection for %.0fs", grace)
            if listener in ready:
                conn, _ = listener.accept()
                conn.settimeout(2.0)
                try:
                    msg = _recv_line(conn)
                    if msg == "PING":
                        conn.sendall(b"PONG owned\n" if owner else b"PONG orphaned\n")
                    elif msg in ("OWN", "TAKE") and owner is None:
                        if msg == "TAKE":
                            socket.send_fds(conn, [b"FD\n"], [fd])
                        else:
                            conn.sendall(b"OK\n")
                        conn.settimeout(None)
                        owner, orphaned_at, conn = conn, None, None
                        log.info("connection %s by a daemon", "taken over" if msg == "TAKE" else "owned")
                    else:
                        conn.sendall(b"BUSY\n")
                except OSError:
                    pass
                finally:
                    if conn is not None:
                        conn.close()
    finally:
        os.close(fd)
        if owner is not None and not released:
            owner.close()


def _recv_line(conn: socket.socket) -> str:
    try:
        data = conn.recv(64)
    except OSError:
        return ""
    return data.decode(errors="replace").strip()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="rollstack.lazystore.holder", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, type=Path)
    p.add_argument("--fd", required=True, type=int)
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE)
    a = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("ROLLSTACK_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = a.socket.with_name(a.socket.name + f".{os.getpid()}")
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(4)
    os.replace(tmp, a.socket)  # atomically replaces a dead holder's socket file
    releaser = None
    try:
        releaser = serve(listener, a.fd, a.grace)
    finally:
        try:
            if os.stat(a.socket).st_ino == os.fstat(listener.fileno()).st_ino:
                a.socket.unlink()
        except OSError:
            pass
        listener.close()
    if releaser is not None:
        os._exit(0)  # the kernel closes the releaser's connection as this process ends (see serve)


# -- the daemon's side -----------------------------------------------------------------------
def _connect(path: Path, timeout: float = 2.0) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        return None
    return s


def pids(state_dir: Path) -> list[int]:
    """Pids of holder processes for `state_dir` (found by their command line)."""
    from rollstack.lazystore.recovery import pids_running

    return pids_running(b"rollstack.lazystore.holder", os.fsencode(str(socket_path(Path(state_dir).absolute()))))


def ping(state_dir: Path) -> str | None:
    """'owned' / 'orphaned' for a live holder, None if there is none."""
    s = _connect(socket_path(state_dir))
    if s is None:
        return None
    try:
        s.sendall(b"PING\n")
        reply = _recv_line(s)
    except OSError:
        return None
    finally:
        s.close()
    return reply.split()[1] if reply.startswith("PONG ") else None


def take(state_dir: Path) -> tuple[int, socket.socket] | None:
    """(fd of the held connection, owner socket) if a holder has one nobody owns."""
    s = _connect(socket_path(state_dir))
    if s is None:
        return None
    try:
        s.sendall(b"TAKE\n")
        msg, fds, _, _ = socket.recv_fds(s, 64, 1)
    except OSError:
        s.close()
        return None
    if msg.strip() != b"FD" or not fds:
        for fd in fds:  # a stray copy of the connection would keep it alive: not ours to keep
            os.close(fd)
        s.close()
        return None
    s.settimeout(None)
    return fds[0], s


def spawn(state_dir: Path, fd: int, grace: float) -> socket.socket:
    """Start a holder for `fd` (in its own session: it outlives us) and own it."""
    path = socket_path(state_dir)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    log_file = open(Path(state_dir) / "holder.log", "ab")
    subprocess.Popen([sys.executable, "-m", "rollstack.lazystore.holder", "--socket", str(path), "--fd", str(fd),
                      "--grace", str(grace)], pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=log_file,
                     stderr=log_file, start_new_session=True)
    log_file.close()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        s = _connect(path)
        if s is not None:
            s.sendall(b"OWN\n")
            if _recv_line(s) == "OK":
                s.settimeout(None)
                return s
            s.close()
        time.sleep(0.02)
    raise RuntimeError(f"the fd-holder did not come up at {path}; see {Path(state_dir) / 'holder.log'}")


def release(owner: socket.socket, wait: float = 5.0) -> None:
    """We stop on purpose: the holder lets go of the connection and exits; returns once it has
    (its end of `owner` closes as its process ends), or after `wait` seconds."""
    try:
        owner.sendall(b"RELEASE\n")
        owner.settimeout(wait)
        owner.recv(64)  # EOF once the holder process is gone
    except OSError:
        pass
    owner.close()


def init_request() -> bytes:
    """The FUSE_INIT message `pyfuse3.assume_init` gives libfuse on a taken-over connection.

    The kernel negotiated the connection with the first daemon; this message only brings the
    new libfuse session to the same state. Protocol 7.38 without FUSE_INIT_EXT: the 16-byte
    fuse_init_in every libfuse 3 understands. libfuse's reply goes to a request id the kernel
    never issued (ENOENT, which libfuse ignores)."""
    body = struct.pack("<IIII", 7, 38, 128 << 10, _TAKEOVER_FLAGS)
    header = struct.pack("<IIQQIIIHH", 40 + len(body), FUSE_INIT, _TAKEOVER_UNIQUE, 0, 0, 0, 0, 0, 0)
    return header + body


def resend_pending(fd: int) -> bool:
    """Ask the kernel to queue again the requests a dead daemon had read but not answered
    (FUSE_NOTIFY_RESEND, Linux 6.9+). False where the kernel does not know the notification."""
    try:
        os.write(fd, struct.pack("<IiQ", 16, FUSE_NOTIFY_RESEND, 0))
        return True
    except OSError as exc:
        log.warning("FUSE_NOTIFY_RESEND refused (%s): requests the dead daemon had read stay unanswered", exc)
        return False


if __name__ == "__main__":
    main()
