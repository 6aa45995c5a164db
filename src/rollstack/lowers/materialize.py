"""`LayerMaterializer`: hot layers copied out of the lazy store into plain local directories.

A layer read through FUSE costs a daemon round trip for every open, directory read, symlink
read and (for each new overlay mount) every extended-attribute probe overlayfs makes; pyfuse3
cannot let the kernel cache directory listings, symlinks or skip opens. For the first
environments of a stack that is the price of starting from metadata alone. Once a layer is hot
(used by `after` environments on this node), it is worth having locally. With a `store` (what a
node passes), the materializer runs `rollstack.lowers.extract` in its own process after a `grace`
period: the blob is streamed once, in blob order, and decoded straight into `<root>/<hex>.tmp`
(chunks the node's disk cache holds are taken from there), single-threaded at SCHED_IDLE /
nice 19 and the idle I/O class, in the node's background cgroup (`cpu` cores at most, default
1.0, and the lowest CPU share: host.background), waiting for idle CPU before each read
(`min_idle`), so it uses at most one core and only what running environments leave, and stopped
while the node forks (`foreground`: host.foreground); the lazy store daemon does no work for it. Without a store (the old path, kept for
tests), it fetches the layer through the daemon (`fetch_all(background=True)`) and copies the
FUSE view with `cp -a`. The directory is renamed to `<root>/<hex>` when complete. New
environments stack the local directory instead of the FUSE one; running ones keep theirs.

- One layer at a time, in a background thread at the lowest CPU and I/O priority; never while
  the filesystem under `root` has less than `min_free` bytes free (8 GiB).
- `budget`: bytes of materialized layers kept; past it the least recently used directories that
  no mounted overlay references (checked in /proc/self/mountinfo) are removed.
- Crash safety: only complete directories are renamed into place; `*.tmp` leftovers are removed
  at start. Each copy's disk use is recorded beside it (`<hex>.bytes`), so a restart does not
  walk every copy again. A layer whose copy fails is tried again after `retry_after` seconds.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from rollstack.host import mountinfo
from rollstack.host.foreground import Foreground
from rollstack.host.libc import spawner_env, syncfs

log = logging.getLogger(__name__)

Copier = Callable[[Path, Path], None]


def copy_tree(src: Path, dst: Path) -> None:
    """`cp -a src/. dst` at the lowest priority; raises CalledProcessError with cp's message."""
    dst.mkdir(parents=True, exist_ok=True)
    argv = ["cp", "-a", "--", f"{src}/.", str(dst)]
    if shutil.which("ionice"):
        argv = ["ionice", "-c", "3", *argv]
    subprocess.run(["nice", "-n", "19", *argv], check=True, capture_output=True, text=True)


def tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


SIZE_SUFFIX = ".bytes"


def _size_file(copy: Path) -> Path:
    """`<root>/<hex>.bytes`: the disk use of the copy `<root>/<hex>`, written when it was made."""
    return copy.with_name(copy.name + SIZE_SUFFIX)


def _recorded_bytes(copy: Path) -> int:
    try:
        return int(_size_file(copy).read_text())
    except (OSError, ValueError):
        return tree_bytes(copy)


def mounted_paths() -> str:
    """This mount namespace's mount table as text, one mount a line: mount point, source and
    options (overlay `lowerdir=` included), escapes decoded (host.mountinfo)."""
    try:
        mounts = mountinfo.read()
    except OSError:
        return ""
    return "\n".join(f"{m.mount_point} {m.source} {m.options}" for m in mounts)


class LayerMaterializer:
    def __init__(self, root: Path, lazy: Any, *, after: int = 2, budget: int = 32 << 30,
                 copier: Copier = copy_tree, retry_after: float = 300.0,
                 in_use: Callable[[], str] = mounted_paths, grace: float = 5.0,
                 min_free: int = 8 << 30, disk_free: Callable[[Path], int] | None = None,
                 store: str | None = None, chunk_cache: Path | None = None,
                 cpu: float = 1.0, cgroup_tag: str | None = None, min_idle: float = 0.0,
                 on_ready: Callable[[], None] | None = None, foreground: Foreground | None = None) -> None:
        self.root = root
        # stops the extraction while the node forks (host.foreground; its own: never held)
        self.foreground = foreground or Foreground()
        self.on_ready = on_ready  # called (worker thread) after a layer's copy is ready
        self.min_idle = min_idle  # idle cores the extraction waits for before each read
        self.cpu = cpu  # cores the extraction may use at most (host.background); 0: uncapped
        self.cgroup_tag = cgroup_tag
        self.cgroups: list[Path] = []
        self.store = store  # set: extract blobs straight into directories (lowers.extract)
        self.chunk_cache = chunk_cache
        self._proc: subprocess.Popen[str] | None = None
        self.extract_stats: list[dict[str, Any]] = []
        self.lazy = lazy
        self.after = after
        self.budget = budget
        self.copier = copier
        self.retry_after = retry_after
        self.in_use = in_use
        self.grace = grace
        self.min_free = min_free
        self.disk_free = disk_free or (lambda p: shutil.disk_usage(p).free)
        self._lock = threading.Lock()
        self._uses: dict[str, int] = {}
        self._ready: dict[str, Path] = {}
        self._sizes: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._failed: dict[str, float] = {}
        self._queued: set[str] = set()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.materialized = 0
        self.evicted = 0
        self.failures = 0
        self.skipped_no_space = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "LayerMaterializer":
        self.root.mkdir(parents=True, exist_ok=True)
        for p in self.root.iterdir():
            if p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)  # an interrupted copy
            elif p.is_dir():
                digest = "sha256:" + p.name
                self._ready[digest] = p
                self._sizes[digest] = _recorded_bytes(p)
                self._last_used[digest] = p.stat().st_mtime
            elif p.suffix == SIZE_SUFFIX and not p.with_suffix("").is_dir():
                p.unlink(missing_ok=True)  # the size of a copy that is gone
        if self.store is not None and self.cgroup_tag:
            from rollstack.host import background

            self.cgroups = background.create(self.cgroup_tag, self.cpu)
        self._thread = threading.Thread(target=self._run, name="materializer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stopping.set()
            self._queue.put(None)
            proc = self._proc
            if proc is not None and proc.poll() is None:
                self.foreground.unregister(proc.pid)  # continued, so the SIGTERM takes effect
                proc.terminate()
            self._thread.join(timeout=60)
            self._thread = None
        if self.cgroups:
            from rollstack.host import background

            background.remove(self.cgroups)
            self.cgroups = []

    # -- the node's calls -----------------------------------------------------------------
    def extract_argv(self, repo: str, digest: str, dst: Path) -> list[str]:
        """The extraction of one layer into `dst` as this node runs it (its own process, in the
        node's background cgroup); `bench materialize` runs the same."""
        from rollstack.lowers.extract import spawn_args

        if self.store is None:
            raise RuntimeError("a materializer without a store copies through FUSE")
        return spawn_args(self.store, repo, digest, dst, self.chunk_cache, self.cgroups, self.min_idle)

    def lower_for(self, digest: str) -> Path | None:
        """The local directory of `digest` if it is complete, else None (use the FUSE one)."""
        with self._lock:
            path = self._ready.get(digest)
            if path is not None:
                self._last_used[digest] = time.time()
            return path

    def ready_digests(self) -> set[str]:
        """The layers that have a complete local copy now."""
        with self._lock:
            return set(self._ready)

    def used(self, refs: Iterable[Any]) -> None:
        """An environment was created on these layers: count, and queue the ones now hot."""
        now = time.time()
        with self._lock:
            for ref in refs:
                d = ref.digest
                self._uses[d] = self._uses.get(d, 0) + 1
                if (self._uses[d] >= self.after and d not in self._ready and d not in self._queued
                        and now - self._failed.get(d, float("-inf")) >= self.retry_after):
                    self._queued.add(d)
                    self._idle.clear()
                    self._queue.put(ref)

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is queued or copying (benchmarks settle on it)."""
        return self._idle.wait(timeout)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"layers": len(self._ready), "bytes": sum(self._sizes.values()), "queued": len(self._queued),
                    "materialized": self.materialized, "evicted": self.evicted, "failures": self.failures,
                    "skipped_no_space": self.skipped_no_space}

    # -- the worker -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.nice(19)  # this thread's work (and cp, via nice) yields to environments
        except OSError:
            pass
        while True:
            ref = self._queue.get()
            if ref is None or self._stopping.is_set():
                return
            try:
                self._materialize(ref)
            except Exception as exc:  # noqa: BLE001 - a failed copy only means FUSE stays in use
                if self._stopping.is_set():
                    return  # stop() ended the extraction: not a failure
                log.warning("materializing %s failed: %s", ref.digest, exc)
                with self._lock:
                    self._failed[ref.digest] = time.time()
                    self.failures += 1
            finally:
                with self._lock:
                    self._queued.discard(ref.digest)
                    if not self._queued:
                        self._idle.set()

    def _materialize(self, ref: Any) -> None:
        hexd = ref.digest.partition(":")[2]
        final, tmp = self.root / hexd, self.root / f"{hexd}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.perf_counter()
        if self._stopping.wait(self.grace):  # the environment that made the layer hot runs alone first
            return
        if self.disk_free(self.root) < self.min_free:  # never fill the node's disk for a speed-up
            with self._lock:
                self.skipped_no_space += 1
                self._failed[ref.digest] = time.time()  # try again after retry_after
            log.warning("not materializing %s: less than %d bytes free under %s", ref.digest, self.min_free, self.root)
            return
        try:
            if self.store is not None:
                self._extract(ref, tmp)
            else:
                self.lazy.fetch_all([ref], background=True)
                self.copier(Path(self.lazy.layer_dir(ref.digest)), tmp)
        except subprocess.CalledProcessError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"{exc.cmd[0]} failed: {(exc.stderr or '').strip()[-500:]}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = tree_bytes(tmp)
        self._make_room(size)
        _size_file(final).write_text(str(size))  # a restart need not walk the copy again
        # On disk before it is published: a restart reuses the copy, so a crash must not leave
        # a renamed directory of empty files; and the writeback happens here, in the background,
        # not at some later syncfs on an environment's path.
        syncfs(tmp)
        os.rename(tmp, final)
        syncfs(self.root)  # the rename
        with self._lock:
            self._ready[ref.digest] = final
            self._sizes[ref.digest] = size
            self._last_used[ref.digest] = time.time()
            self.materialized += 1
        log.info("materialized %s (%d bytes) in %.1fs", ref.digest, size, time.perf_counter() - t0)
        if self.on_ready is not None:
            try:
                self.on_ready()
            except Exception:  # noqa: BLE001 - a hook must not fail the layer
                log.exception("materializer on_ready hook failed")

    def _extract(self, ref: Any, tmp: Path) -> None:
        """`python -m rollstack.lowers.extract` into `tmp`, its own low-priority process."""
        import json

        argv = self.extract_argv(ref.repo, ref.digest, tmp)
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("materializer stopping")
            self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=spawner_env())
            self.foreground.register(self._proc.pid)
        try:
            out, err = self._proc.communicate()
        finally:
            self.foreground.unregister(self._proc.pid)
            code = self._proc.returncode
            self._proc = None
        if code != 0:
            raise subprocess.CalledProcessError(code, argv, out, err)
        try:
            doc = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            doc = {}
        with self._lock:
            self.extract_stats.append({"digest": ref.digest, **doc})

    def _make_room(self, incoming: int) -> None:
        """Remove least recently used, unmounted layers until `incoming` more bytes fit."""
        with self._lock:
            total = sum(self._sizes.values())
            order = sorted(self._ready, key=lambda d: self._last_used.get(d, 0.0))
        if total + incoming <= self.budget:
            return
        mounts = self.in_use()
        for d in order:
            if total + incoming <= self.budget:
                break
            with self._lock:
                path = self._ready.get(d)
                if path is None or str(path) in mounts:
                    continue
                del self._ready[d]  # new environments stop using it before it is removed
                size = self._sizes.pop(d, 0)
            shutil.rmtree(path, ignore_errors=True)
            _size_file(path).unlink(missing_ok=True)
            total -= size
            self.evicted += 1
