"""Decompressing a layer's tar stream: magic-byte detection, gzip off the parsing thread.

gzip (the usual OCI layer encoding) is decoded by a child process: `igzip -dc` (Intel ISA-L,
Debian's `isal`) when installed, else `pigz -dc`. Another core inflates while Python parses tar
headers and the chunk workers compress, and the child runs on even when this process's threads
contend for the GIL. igzip inflates ~3x faster than pigz (whose inflate is single-threaded too):
a 423 MB tar from its 146 MB gzip in 0.57 vs 2.1 CPU-s, the same bytes. Without either (or with
`ROLLSTACK_GZIP_DECODER=thread`) zlib inflates on a thread of its own; `=pigz` / `=igzip` pick
one child. All check the CRC-32 and length trailers. zstd, bzip2 and xz are decoded in-process.
`Forward` gives tarfile's seeking mode a forward-only view of the stream (much cheaper per member
than its stream mode).
"""

from __future__ import annotations

import bz2
import fcntl
import io
import lzma
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import zlib
from typing import Any, BinaryIO, Callable

import zstandard

from rollstack.core.blocks import BlockPipe
from rollstack.format.writer import Readable, _read_full

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_BUF = 1 << 20


class Decoded:
    """The decompressed tar stream; `check()` after EOF raises if the decoder failed (a child
    decoder's exit status: bad CRC, truncated input). Leaving the block stops the child."""

    def __init__(self, stream: BinaryIO, proc: subprocess.Popen[bytes] | None = None,
                 feeder: threading.Thread | None = None, errors: BinaryIO | None = None) -> None:
        self._stream = stream
        self._proc = proc
        self._feeder = feeder
        self._errors = errors
        self.feed_error: BaseException | None = None
        self.on_exit: Callable[[], None] | None = None

    def read(self, n: int = -1) -> bytes:
        return self._stream.read(n)

    def check(self) -> None:
        if self._proc is None:
            return
        rc = self._proc.wait()
        if self._feeder is not None:
            self._feeder.join()
        if self.feed_error is not None:
            raise self.feed_error
        if rc != 0:
            assert self._errors is not None
            self._errors.seek(0)
            msg = self._errors.read().decode(errors="replace").strip().splitlines()
            raise OSError(f"gzip: {msg[-1] if msg else f'{self._proc.args!r} exit {rc}'}")

    def __enter__(self) -> "Decoded":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.on_exit is not None:
            self.on_exit()
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            assert self._proc.stdout is not None
            self._proc.stdout.close()
            if self._feeder is not None:
                self._feeder.join()
            if self._errors is not None:
                self._errors.close()


def decompressing(stream: BinaryIO) -> Decoded:
    """Detect the compression by magic bytes and unwrap it. We decompress ourselves rather than
    let tarfile do it because tarfile's stream mode never checks gzip's CRC/length trailer."""
    start = _tell(stream)
    head = _read_exact(stream, 6)
    rest: BinaryIO = _Prefixed(head, stream)  # type: ignore[assignment]
    if head.startswith(ZSTD_MAGIC):
        return Decoded(zstandard.ZstdDecompressor().stream_reader(rest, read_size=READ_BUF, read_across_frames=True))
    if head.startswith(b"\x1f\x8b"):
        child = gzip_child()
        if child is not None:
            return _child(child, stream, head, start)
        return _gunzip_thread(rest)
    if head.startswith(b"BZh"):
        return Decoded(bz2.BZ2File(rest))  # type: ignore[arg-type]
    if head.startswith(b"\xfd7zXZ\x00"):
        return Decoded(lzma.LZMAFile(rest))  # type: ignore[arg-type]
    return Decoded(rest)


def _tell(stream: BinaryIO) -> int | None:
    """The position of a seekable regular file (a decoder child can then read it directly), else None."""
    try:
        if not stream.seekable() or not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        return stream.tell()
    except (OSError, AttributeError, ValueError):
        return None


def _big_pipe(proc: subprocess.Popen[bytes]) -> None:
    """1 MiB pipe buffer (from 64 KiB): pigz keeps inflating while we are descheduled. Same CPU;
    wall time for a 1 GB tar in 4 loaded pairs: 12.3/12.0/15.1/15.3 s vs 23.3/14.5/19.3/15.2 s."""
    if PIPE_BYTES:
        try:
            fcntl.fcntl(proc.stdout.fileno(), 1031, PIPE_BYTES)  # type: ignore[union-attr]  # F_SETPIPE_SZ
        except OSError:  # over /proc/sys/fs/pipe-max-size for an unprivileged user: keep the default
            pass


PIPE_BYTES = int(os.environ.get("ROLLSTACK_PIGZ_PIPE_BYTES", str(1 << 20)))


def gzip_child() -> list[str] | None:
    """The gzip decoder child's command line (`GZIP_DECODER`: auto = igzip, else pigz), or None:
    decode on a thread."""
    for name, cmd in (("igzip", IGZIP), ("pigz", PIGZ)):
        if GZIP_DECODER in ("auto", name) and shutil.which(name):
            return cmd
    return None


def _child(cmd: list[str], stream: BinaryIO, head: bytes, start: int | None) -> Decoded:
    """gzip decoded by a child (another core; it checks the CRC and length trailer). A regular
    file is handed over as the child's stdin; anything else is fed by a thread."""
    errors = tempfile.TemporaryFile()
    if start is not None:
        stream.seek(start)
        # the child reads the descriptor itself: set its offset (a buffered reader's seek back into
        # its own read-ahead moves only the buffer, leaving the descriptor past the head)
        os.lseek(stream.fileno(), start, os.SEEK_SET)
        proc = subprocess.Popen(cmd, stdin=stream, stdout=subprocess.PIPE, stderr=errors)
        _big_pipe(proc)
        return Decoded(proc.stdout, proc, None, errors)  # type: ignore[arg-type]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
    _big_pipe(proc)
    decoded = Decoded(proc.stdout, proc, None, errors)  # type: ignore[arg-type]

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(head)
            while block := stream.read(READ_BUF):
                proc.stdin.write(block)
        except BrokenPipeError:  # the child stopped early (bad data or we are abandoning): its status says why
            pass
        except BaseException as exc:  # reading the source failed: report it, not the child's EOF error
            decoded.feed_error = exc
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass

    decoded._feeder = threading.Thread(target=feed, name="rollstack-gzip-feed", daemon=True)
    decoded._feeder.start()
    return decoded


# pigz threads (inflate runs in one; the others read, write and check the CRC). `-p 1` saves ~1
# CPU-s per GB of tar (3.4 vs 4.2-4.6) but gave slower wall times in the same loaded runs
# (16.9-33.4 s vs 13.4-21.5 s for a 1 GB tar, load 26-65): the default stays 2.
PIGZ = ["pigz", "-dc", "-p", os.environ.get("ROLLSTACK_PIGZ_THREADS", "2")]
IGZIP = ["igzip", "-dc"]
GZIP_DECODER = os.environ.get("ROLLSTACK_GZIP_DECODER", "auto")  # auto | igzip | pigz | thread


def _gunzip_thread(src: BinaryIO) -> Decoded:
    """gzip decoded by zlib on a thread of its own (zlib releases the GIL), so decompression
    overlaps tar parsing and chunk compression. Members are concatenated (as gzip does), zero
    padding after the last one is allowed, CRC-32 and length trailers are checked by zlib."""
    out = BlockPipe(16)
    put = out.put

    def run() -> None:
        try:
            d = zlib.decompressobj(31)
            member = True  # inside a gzip member
            pending = b""
            while not out.stopped:
                block = pending or src.read(READ_BUF)
                pending = b""
                if not block:
                    break
                if not member:
                    block = block.lstrip(b"\0")
                    if not block:
                        continue
                    d, member = zlib.decompressobj(31), True
                data = d.decompress(block, READ_BUF)
                while d.unconsumed_tail and not d.eof:  # bounded output per call
                    put(data)
                    data = d.decompress(d.unconsumed_tail, READ_BUF)
                if data:
                    put(data)
                if d.eof:
                    member, pending = False, d.unused_data
            if member:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            put(None)
        except BaseException as exc:  # handed to the reading thread, which raises it
            put(exc)

    thread = threading.Thread(target=run, name="rollstack-gunzip", daemon=True)
    thread.start()
    decoded = Decoded(out)  # type: ignore[arg-type]

    def stop() -> None:
        out.stop()
        thread.join()
    decoded.on_exit = stop
    return decoded


def drain(stream: Readable) -> None:
    """Read past the tar end marker to EOF, so decompressors verify their trailers/checksums."""
    while stream.read(READ_BUF):
        pass


class Forward:
    """A forward-only file for tarfile's seeking mode ("r:"): `seek` only skips ahead. This is
    much cheaper per member than tarfile's stream mode, which re-buffers every read."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n) if n < 0 else _read_full(self._stream, n)
        self._pos += len(data)
        return data

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset += self._pos
        elif whence != 0:
            raise OSError("cannot seek from the end of a tar stream")
        if offset < self._pos:
            raise OSError(f"tar stream would need to seek back from {self._pos} to {offset}")
        while self._pos < offset:
            if not self.read(min(offset - self._pos, READ_BUF)):
                break  # at EOF: the next read comes up short and tarfile says "unexpected end"
        return self._pos


class _Prefixed(io.RawIOBase):
    """Puts already-consumed bytes back in front of a stream (works for non-seekable ones)."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = head
        self._stream = stream

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n < 0:
                out, self._head = self._head + self._stream.read(), b""
                return out
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._stream.read(n)

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    out = b""
    while len(out) < n:
        more = stream.read(n - len(out))
        if not more:
            break
        out += more
    return out


