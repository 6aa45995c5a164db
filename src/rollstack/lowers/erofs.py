"""`ErofsLowers`: layers stacked as in-kernel EROFS mounts over their lazy-store blob.

A layer on a FUSE lower costs a daemon round trip for each lookup a new overlay makes and for
each `trusted.overlay.*` probe (~35-40 us each here), which makes commands that walk or import
many files 2-14x slower than on a local directory until the layer is materialized (minutes for a
2 GB image). Here, as soon as an environment has used a layer, its TOC is turned into an EROFS
metadata image (format/erofs.py: ~0.12 s of CPU per 18k entries; in its own process at nice 10,
or in the node's worker thread when a create waits for it) and mounted once per node:

    mount -t erofs -o ro,device=<lazy mountpoint>/blobs/<hex>,directio <root>/<hex>.img <root>/<hex>

Every later environment stacks that mount: lookups, stat, readdir, readlink and xattrs are
kernel work on a local image (native speed), and only file data is read from the blob, a FUSE
file of the lazy store, on misses of EROFS' own page cache (same fetch, cache and trace path as
the FUSE tree), which every environment stacking the mount shares.

An image published beside the layer (plan/lowers.py: `group publish`/`import` name it in the
group manifest, `LayerRef.erofs`) is fetched instead (`fetch_image`), checked (its digest, then
unpacked with a size bound and `format.erofs.check_image`) and mounted by a worker of its own,
never queued behind a build: ~15-20 ms, so a create can wait for it, the first one of a stack included. An image that fails
a check is handed to the build worker and built here as if none had been published (the fetch
worker never builds: one build at a time, and the next fetch is not held up).

Lower choice per layer (node/stages.py): materialized directory > EROFS mount > FUSE directory.
A layer EROFS cannot express (format.erofs raises FormatError: an xattr namespace without an
EROFS index, a name over 255 bytes) stays on FUSE; so does every layer when the kernel lacks
file-backed EROFS (Linux < 6.12). Mounts are detached when the node stops and at the next start
(images are kept: a layer's image, built here or published, never changes).
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from rollstack.host import atomic, libc, mountinfo
from rollstack.host.foreground import Foreground
from rollstack.host.umount import detach

log = logging.getLogger(__name__)


def supported() -> bool:
    """The kernel has EROFS and mounts it from a regular file (Linux >= 6.12)."""
    try:
        if "erofs" not in Path("/proc/filesystems").read_text():
            return False
    except OSError:
        return False
    release = os.uname().release.split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) >= (6, 12)
    except (ValueError, IndexError):
        return False


def mount_image(image: Path, blob: Path, target: Path) -> None:
    """mount(2) the EROFS `image` at `target`, its data device the file `blob` (read-only)."""
    target.mkdir(parents=True, exist_ok=True)
    # directio: EROFS reads the blob with direct I/O, so each read is the file range EROFS wants
    # (its own per-file readahead), cached once in EROFS' page cache. Buffered, the blob file's
    # readahead runs across file boundaries into data nobody asked for (+40% bytes fetched on a
    # stdlib tree; registry fetches that made a first `cat` of every .py 6x slower on a stack).
    opts = b"device=" + os.fsencode(blob) + b",directio"
    err = libc.mount(os.fsencode(image), target, b"erofs", libc.MS_RDONLY, opts)
    if err:
        raise OSError(err, f"mount -t erofs {image} {target} (device={blob}): {os.strerror(err)}")


def build_argv(tocs_dir: Path, digest: str, out: Path) -> list[str]:
    """A background build as the node runs it: its own process, at nice 10 (`_hurry` lifts it
    to 0 once a create waits for it)."""
    return ["nice", "-n", "10", sys.executable, "-m", "rollstack.lowers.erofs", str(tocs_dir), digest, str(out)]


def build_image(tocs_dir: Path, digest: str) -> bytes:
    """The layer's EROFS image from the lazy store's TOC cache (the layer must have been added
    to the daemon). Raises RollstackError (FormatError: not expressible in EROFS)."""
    from rollstack.errors import RollstackError
    from rollstack.format import erofs
    from rollstack.lazystore.tocs import TocCache

    def missing(*_: Any) -> Any:
        raise RollstackError(f"the TOC of {digest} is not in {tocs_dir}")

    toc = TocCache(tocs_dir).open(digest, missing, missing).toc
    return erofs.build(toc, digest)[0]


class ErofsLowers:
    def __init__(self, root: Path, lazy: Any, tocs_dir: Path,
                 on_ready: Callable[[], None] | None = None, min_idle: float = 0.0, max_wait: float = 5.0,
                 meter: Any = None, grace: float = 0.0,
                 fetch_image: Callable[[Any], bytes] | None = None,
                 foreground: Foreground | None = None) -> None:
        self.root = Path(root)
        # stops a background build while the node forks (host.foreground; its own: never held);
        # not one a create waits for
        self.foreground = foreground or Foreground()
        self.lazy = lazy  # LazyStore: its layer_dir() says where /blobs is
        self.tocs_dir = Path(tocs_dir)
        self.on_ready = on_ready  # called (worker thread) after a layer's mount is ready
        # reads the image published beside a layer (ref.erofs, plan/lowers.py) from the store
        self.fetch_image = fetch_image
        self._published: dict[str, Any] = {}  # digest -> a LayerRef naming its published image
        self._unusable: set[str] = set()  # published images that failed their checks: built here
        self._fetched = 0  # images taken from the store instead of built
        # a build nobody waits for first waits (up to max_wait s) for min_idle idle cores
        self.min_idle, self.max_wait, self.grace = min_idle, max_wait, grace
        self._first_use: dict[str, float] = {}
        self._meter = meter
        self._pacer: Callable[[], float] | None = None
        self._urgent: set[str] = set()  # digests a create waits for (`ensure`): no idle wait
        self._ready: dict[str, Path] = {}
        self._queued: set[str] = set()
        self._failed: dict[str, str] = {}
        self._seconds: dict[str, float] = {}
        self._lock = threading.Lock()
        self._queue: "queue.Queue[str | None]" = queue.Queue()  # builds
        # fetches of published images: their own worker, never queued behind a build
        self._fetches: "queue.Queue[str | None]" = queue.Queue()
        self._idle = threading.Event()
        self._stopping = threading.Event()  # stop(): a build waiting for its grace gives up
        self._idle.set()
        self._done = threading.Condition(self._lock)  # notified when a layer is ready or failed
        self._threads: list[threading.Thread] = []
        self._proc: subprocess.Popen[str] | None = None  # the background build under way

    def start(self) -> "ErofsLowers":
        self.root.mkdir(parents=True, exist_ok=True)
        for child in self.root.iterdir():  # a previous run's mounts: their blob may be gone
            if child.is_dir():
                try:
                    detach(child)
                    child.rmdir()
                except OSError:
                    log.warning("cannot clear stale EROFS mount %s", child)
            elif child.name.endswith(".tmp"):
                child.unlink(missing_ok=True)
        self._threads = [threading.Thread(target=self._run, args=(q,), name=name, daemon=True)
                         for q, name in ((self._queue, "erofs-build"), (self._fetches, "erofs-fetch"))]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._threads:
            self._queue.put(None)
            self._fetches.put(None)
            for t in self._threads:
                t.join(timeout=30)
            self._threads = []
        with self._lock:
            ready, self._ready = self._ready, {}
        for path in ready.values():
            try:
                detach(path)  # overlays stacked on it keep their own reference
            except OSError:
                log.exception("detaching %s failed", path)

    # -- what the node asks --------------------------------------------------------------------
    def lower_for(self, digest: str) -> Path | None:
        with self._lock:
            return self._ready.get(digest)

    def request(self, refs: Iterable[Any]) -> set[str]:
        """`used(refs)`; returns the digests this call was the first to ask for."""
        refs = list(refs)
        with self._lock:
            known = set(self._ready) | self._queued | set(self._failed)
        self.used(refs)
        return {r.digest for r in refs} - known

    def published(self, refs: Iterable[Any]) -> bool:
        """Whether every one of `refs` is mounted already or has a published image to fetch
        (no build: a create can wait for these at the cost of a fetch and a mount)."""
        if self.fetch_image is None:
            return False
        with self._lock:
            return all(r.digest in self._ready or (getattr(r, "erofs", "") and r.digest not in self._failed
                                                    and r.digest not in self._unusable) for r in refs)

    def used(self, refs: Iterable[Any]) -> None:
        with self._lock:
            for ref in refs:
                d = ref.digest
                if getattr(ref, "erofs", "") and self.fetch_image is not None and d not in self._unusable:
                    self._published.setdefault(d, ref)
                if d not in self._ready and d not in self._queued and d not in self._failed:
                    self._first_use.setdefault(d, time.monotonic())
                    self._queued.add(d)
                    self._idle.clear()
                    (self._fetches if d in self._published else self._queue).put(d)

    def ensure(self, refs: Iterable[Any], timeout: float) -> bool:
        """`used(refs)`, then wait up to `timeout` s until every one of them has its mount (or
        failed): the first environment of a stack on this node starts on EROFS lowers too.
        True if all are mounted."""
        refs = list(refs)
        digests = [r.digest for r in refs]
        with self._lock:
            # only layers still to come (`_settled` forgets them): a ready one left here would
            # make every later background build urgent
            self._urgent.update(d for d in digests if d not in self._ready and d not in self._failed)
            proc = self._proc
            # a background build is under way: it now runs at normal priority (while it is
            # still ours, under the lock: once reaped, its pid may be another process's)
            if proc is not None and proc.returncode is None:
                self._prioritize(proc)
        self.used(refs)
        end = time.monotonic() + timeout
        with self._done:
            while True:
                pending = [d for d in digests if d not in self._ready and d not in self._failed]
                left = end - time.monotonic()
                if not pending or left <= 0:
                    return all(d in self._ready for d in digests)
                self._done.wait(left)

    def wait_idle(self, timeout: float) -> bool:
        """Until every queued layer is mounted or failed (tests, benchmarks)."""
        return self._idle.wait(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"ready": len(self._ready), "queued": len(self._queued), "failed": len(self._failed),
                    "fetched": self._fetched, "build_seconds": round(sum(self._seconds.values()), 3)}

    def failures(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failed)

    # -- the worker ------------------------------------------------------------------------------
    def _run(self, jobs: "queue.Queue[str | None]") -> None:
        while True:
            digest = jobs.get()
            if digest is None:
                return
            handed_over = False
            try:
                self._pace(digest)
                if self._stopping.is_set():
                    raise RuntimeError("the node is stopping")
                path = self._prepare(digest)
            except _BuildInstead:
                handed_over = True  # still queued: the build worker's now
                self._queue.put(digest)
            except Exception as exc:  # noqa: BLE001 - the layer stays on its FUSE lower
                log.warning("EROFS lower for %s unavailable: %s", digest, exc)
                with self._lock:
                    self._failed[digest] = str(exc)
            else:
                with self._lock:
                    self._ready[digest] = path
                if self.on_ready is not None:
                    try:
                        self.on_ready()
                    except Exception:  # noqa: BLE001 - a hook must not stop the worker
                        log.exception("EROFS on_ready hook failed")
            finally:
                if not handed_over:
                    self._settled(digest)

    def _settled(self, digest: str) -> None:
        """The layer is mounted or failed: no longer queued; waiters look again."""
        with self._lock:
            self._queued.discard(digest)
            self._urgent.discard(digest)
            self._done.notify_all()
            if not self._queued:
                self._idle.set()

    def _urgent_now(self) -> bool:
        with self._lock:
            return bool(self._urgent)

    def _pace(self, digest: str) -> float:
        """Background work waits: `grace` s after the layer's first use (its first environment
        is starting on both cores right now), then for idle CPU (host.cpuidle), like background
        fill and the materializer, at most `max_wait` s. Neither once a create waits for a
        build (`ensure`)."""
        t0 = time.monotonic()
        with self._lock:
            if digest in self._published:  # a fetch, not a build: nothing to keep off the CPU
                return 0.0
            until = self._first_use.get(digest, t0) + self.grace
        while time.monotonic() < until and not self._urgent_now() and not self._stopping.is_set():
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        if self.min_idle > 0:
            if self._pacer is None:
                from rollstack.host.cpuidle import idle_pacer

                self._pacer = idle_pacer(self.min_idle, self._meter, self.max_wait, until=self._urgent_now)
            self._pacer()
        return time.monotonic() - t0

    def _prepare(self, digest: str) -> Path:
        hexd = digest.partition(":")[2]
        image = self.root / f"{hexd}.img"
        t0 = time.perf_counter()
        with self._lock:
            ref = self._published.get(digest)
        if ref is not None and not image.exists() and not self._fetch(ref, image):
            with self._lock:  # from now on a layer without a (usable) published image
                self._published.pop(digest, None)
                self._unusable.add(digest)
            raise _BuildInstead(digest)
        if not image.exists():
            tmp = image.with_name(image.name + ".tmp")
            with self._lock:
                urgent = digest in self._urgent
            if urgent:  # a create waits: build here, ~0.1 s sooner than a new interpreter
                tmp.write_bytes(build_image(self.tocs_dir, digest))
            else:  # nobody waits: its own process at nice 10, off the node's GIL and the starting
                # environment's CPU (measured: in-thread, a lone cold start lost ~0.1-0.3 s)
                proc = subprocess.Popen(build_argv(self.tocs_dir, digest, tmp), env=libc.spawner_env(),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                with self._lock:  # registered before `ensure` can see it (and unregister it)
                    self.foreground.register(proc.pid)
                    self._proc = proc
                    hurry = bool(self._urgent)
                if hurry:  # a create began waiting between the check above and the spawn
                    self._prioritize(proc)
                try:
                    _, err = proc.communicate()
                finally:
                    self.foreground.unregister(proc.pid)
                    with self._lock:
                        self._proc = None
                if proc.returncode != 0:
                    tmp.unlink(missing_ok=True)
                    raise RuntimeError((err.strip().splitlines() or [f"exit {proc.returncode}"])[-1])
            os.replace(tmp, image)
        blob = Path(self.lazy.layer_dir(digest)).parent.parent / "blobs" / hexd
        target = self.root / hexd
        if not mountinfo.is_mounted(target):
            mount_image(image, blob, target)
        with self._lock:
            self._seconds[digest] = time.perf_counter() - t0
        return target

    def _fetch(self, ref: Any, image: Path) -> bool:
        """The image published beside the layer, checked (its digest, then that it is the
        image of this layer in this format version) and written to `image`. False on any
        failure: the layer's image is then built here, as for an unpublished layer."""
        from rollstack.format.erofs import check_image, unpack_image
        from rollstack.store.names import sha256_digest

        try:
            assert self.fetch_image is not None
            packed = self.fetch_image(ref)
            if sha256_digest(packed) != ref.erofs:
                raise ValueError(f"the image does not match its digest {ref.erofs}")
            data = unpack_image(packed)
            check_image(data, ref.digest)
        except Exception as exc:  # noqa: BLE001 - an unusable image costs a build, never the layer
            log.warning("published EROFS image of %s unusable (%s); building it here", ref.digest, exc)
            return False
        atomic.replace(image, data)
        with self._lock:
            self._fetched += 1
        return True

    def _prioritize(self, proc: "subprocess.Popen[str]") -> None:
        """A create waits for this build: never stopped by a fork from now on, and at normal
        priority."""
        self.foreground.unregister(proc.pid)
        _hurry(proc)


class _BuildInstead(Exception):
    """The fetch worker hands a layer whose published image is unusable to the build worker."""


def _hurry(proc: "subprocess.Popen[str]") -> None:
    """A background build a create now waits for runs at normal priority (SCHED_OTHER, nice 0):
    at nice 10 on a busy node it gets a small share of a core while the create waits."""
    try:
        os.sched_setscheduler(proc.pid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, proc.pid, 0)
    except (OSError, AttributeError):
        pass  # it has exited


def main(argv: list[str]) -> int:
    """`python -m rollstack.lowers.erofs TOCS_DIR DIGEST OUT`: `build_image` into OUT."""
    from rollstack.errors import RollstackError

    tocs, digest, out = argv
    libc.die_with_spawner()  # never an orphan, least of all one a fork stopped (host.foreground)
    try:
        image = build_image(Path(tocs), digest)
    except RollstackError as exc:
        print(f"rollstack.lowers.erofs: {exc}", file=sys.stderr)
        return 2
    Path(out).write_bytes(image)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
