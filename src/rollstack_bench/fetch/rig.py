"""The rig of `bench fetch`: the stack's blobs, the registry behind a shaped link, overlays and
chroot runs, page-cache drops, and `StackRig`, a lazy store daemon per measurement over the
published stack (the sections, bench.fetch.readpath and bench.fetch.traces, build on it)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

STACK = ("os", "repo-more-itertools", "harness-mini-swe-agent")  # bottom first
WORKDIR = "/work/more-itertools"
COMMAND = 'python3 -c "import more_itertools, pytest"'
CGROUP = Path("/sys/fs/cgroup/pids/rollstack")
CHROOT = shutil.which("chroot", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or "/usr/sbin/chroot"


def log(msg: str) -> None:
    print(f"[bench fetch] {msg}", file=sys.stderr, flush=True)


def drop_page_cache(keep: Path | None = None) -> None:
    """Drop the page cache (the node forgets everything it read), then re-read `keep`: the
    registry's storage, which in a real deployment sits on another machine whose cache we do
    not drop (otherwise every range GET would also pay a local disk seek)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")
    if keep is not None and keep.exists():
        for f in keep.rglob("data"):
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(8 << 20):
                        pass


# -- stack preparation -------------------------------------------------------------------------
def ensure_blob(src: Path, out_dir: Path, name: str) -> tuple[str, Path]:
    """Convert `src` once (cached by name + source mtime)."""
    from rollstack.format import convert

    out_dir.mkdir(parents=True, exist_ok=True)
    blob, stamp = out_dir / f"{name}.blob", out_dir / f"{name}.stamp"
    built = src.parent / ".stamps" / src.name  # the corpus builder's stamp: written once a component is complete
    if built.exists():
        key = f"{src}:{built.read_text().strip()}:{built.stat().st_mtime_ns}"
    elif (src.parent / ".stamps").is_dir():
        raise RuntimeError(f"{src} is being (re)built by the corpus builder; try again when it is done")
    else:
        key = f"{src}:{src.stat().st_mtime_ns}"
    if blob.exists() and stamp.exists() and stamp.read_text().split("\n")[0] == key:
        return stamp.read_text().split("\n")[1], blob
    t0 = time.perf_counter()
    info = convert(src, blob)
    stamp.write_text(f"{key}\n{info.digest}\n")
    log(f"converted {name}: {info.size >> 20} MiB, {info.entries} entries in {time.perf_counter() - t0:.1f}s")
    return info.digest, blob


def big_file_layer(out_dir: Path, mib: int) -> tuple[str, Path]:
    """A layer holding one `mib` MiB file of incompressible bytes (cached)."""
    src = out_dir / f"big-{mib}"
    if not (src / "big.bin").exists():
        src.mkdir(parents=True, exist_ok=True)
        with open(src / "big.bin.tmp", "wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        os.replace(src / "big.bin.tmp", src / "big.bin")
    return ensure_blob(src, out_dir, f"big-{mib}")


@contextmanager
def registry(work: Path, profile: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(registry URL, link facts): in a shaped netns when possible, else on loopback."""
    if profile != "none" and os.geteuid() == 0:
        try:
            from rollstack_bench.systems.registry import NetnsRegistry
            from rollstack_bench.link.netem import ShapedLink

            with ShapedLink(profile) as link, NetnsRegistry(link, work / "registry") as reg:
                yield reg.url, {"shaped": True, **link.facts()}
            return
        except ImportError:
            pass
    from rollstack.store import RegistryServer

    with RegistryServer(work / "registry-loopback") as server:
        yield server.url, {"shaped": False, "note": "loopback registry, no network shaping"}


@contextmanager
def overlay(lowers: list[Path], scratch: Path, options: str | None = None) -> Iterator[Path]:
    """An overlay of `lowers` (top first) in a fresh dir under `scratch`, unmounted on exit.

    Without `options` it is production's mount (run.overlay.mount_overlay, pinned options).
    With `options` (the overlay-options section's probe of option sets production does not set;
    "" = kernel defaults) it is a `mount -t overlay` with exactly those options.
    """
    from rollstack.host.umount import unmount
    from rollstack.run.overlay import mount_overlay

    d = Path(tempfile.mkdtemp(prefix="ov-", dir=scratch))
    upper, wd, merged = d / "upper", d / "work", d / "merged"
    for p in (upper, wd, merged):
        p.mkdir()
    if options is None:
        mount_overlay(lowers, upper, wd, merged)
    else:
        opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={wd}" + (f",{options}" if options else "")
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield merged
    finally:
        unmount(merged)
        shutil.rmtree(d, ignore_errors=True)


def chroot_run(root: Path, env_id: str | None = None, command: str = COMMAND) -> float:
    """Seconds for `command` in a chroot of `root` (in cgroup rollstack/<env_id> if given)."""
    cg = None
    if env_id and CGROUP.parent.exists():
        cg = CGROUP / env_id
        cg.mkdir(parents=True, exist_ok=True)

    def enter() -> None:
        if cg is not None:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    r = subprocess.run([CHROOT, str(root), "/bin/sh", "-c", f"cd {WORKDIR} && {command}"], env=env,
                       preexec_fn=enter, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if cg is not None:
        try:
            cg.rmdir()
        except OSError:
            pass
    if r.returncode != 0:
        raise RuntimeError(f"command failed in chroot: {r.stderr[-2000:]}")
    return dt


def wait_written(lazy: Any, timeout: float = 30.0) -> None:
    """Until the daemon's write-back queue is empty (it writes once reads go quiet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and lazy.stats()["disk_cache"].get("writeback_chunks", 0):
        time.sleep(0.05)


def read_seq(path: Path, block: int = 1 << 20) -> float:
    """MB/s of one sequential read of `path`."""
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(block)
            if not b:
                break
            n += len(b)
    return n / (time.perf_counter() - t0) / 1e6


class StackRig:
    """The published stack (`refs`, bottom first) in the registry `store_url`; `start` a fresh
    lazy store daemon for one measurement, `lowers` its layer dirs for an overlay (top first)."""

    def __init__(self, work: Path, store_url: str, refs: list[dict[str, str]], sizes: dict[str, int],
                 registry_data: Path | None = None) -> None:
        self.work, self.store_url, self.refs, self.sizes = work, store_url, refs, sizes
        self.registry_data = registry_data
        self.unpacked_bytes = 0
        self.stack_bytes = sum(sizes[r["digest"]] for r in refs)

    def start(self, name: str, **kw: Any):
        from rollstack.lazystore.client import LazyStoreClient
        from rollstack.lazystore.config import DaemonConfig

        state = self.work / "runs" / name
        shutil.rmtree(state, ignore_errors=True)
        return LazyStoreClient.start(DaemonConfig.of(state / "mnt", state / "state", self.store_url, **kw))

    def lowers(self, lazy: Any) -> list[Path]:
        return [lazy.layer_dir(r["digest"]) for r in reversed(self.refs)]


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4), "n": len(xs)}
