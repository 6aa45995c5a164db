"""ErofsLowers' scheduling without a kernel mount (a layer whose TOC is not cached fails at build
time, which is enough to observe when a build runs): background builds wait `grace` seconds
after the first use, a create that waits (`ensure`) skips the wait, each layer is tried once."""

from __future__ import annotations

import time
from pathlib import Path

from rollstack.lowers.erofs import ErofsLowers, _hurry


class _Lazy:
    def layer_dir(self, digest: str) -> Path:
        return Path("/nonexistent/layers") / digest.partition(":")[2]


class _Ref:
    def __init__(self, n: int) -> None:
        self.digest = "sha256:" + f"{n:02x}" * 32


def test_background_builds_wait_for_the_grace_and_ensure_does_not(tmp_path: Path) -> None:
    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs", grace=30.0).start()
    try:
        lowers.used([_Ref(1)])
        time.sleep(0.3)
        assert lowers.failures() == {}  # still in its grace: not tried yet
        t = time.monotonic()
        assert lowers.ensure([_Ref(1)], timeout=10) is False  # tried now, without the grace
        assert time.monotonic() - t < 5
        assert "not in" in lowers.failures()[_Ref(1).digest]
        lowers.used([_Ref(1)])  # a failed layer is not queued again
        assert lowers.stats()["queued"] == 0 and lowers.lower_for(_Ref(1).digest) is None
    finally:
        lowers.stop()


def test_ensure_times_out_without_losing_the_build(tmp_path: Path) -> None:
    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs").start()
    try:
        assert lowers.ensure([_Ref(2)], timeout=0) is False
        assert lowers.wait_idle(10)
        assert _Ref(2).digest in lowers.failures()
    finally:
        lowers.stop()


def test_hurry_lifts_a_background_build_to_normal_priority() -> None:
    import os
    import subprocess
    import sys

    from components import require_root

    require_root()  # lowering a nice value back to 0 needs CAP_SYS_NICE
    code = "import os, time; os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0)); print(1, flush=True); time.sleep(30)"
    proc = subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "1"
        assert os.sched_getscheduler(proc.pid) == os.SCHED_BATCH
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 10
        _hurry(proc)
        assert os.sched_getscheduler(proc.pid) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 0
    finally:
        proc.kill()
        proc.wait()
    _hurry(proc)  # an exited build: nothing to do, no error


class _PublishedRef(_Ref):
    def __init__(self, n: int, image: bytes) -> None:
        from rollstack.store.names import sha256_digest

        super().__init__(n)
        self.erofs, self.erofs_size = sha256_digest(image), len(image)


def _raw(ref: _Ref) -> bytes:
    from rollstack.format import erofs
    from rollstack.format.toc import EntryType, Toc, TocEntry

    toc = Toc([TocEntry(path="", type=EntryType.DIR, mode=0o755),
               TocEntry(path="f", type=EntryType.REG, mode=0o644, size=5)])
    return erofs.build(toc, ref.digest)[0]


def _image(ref: _Ref) -> bytes:
    """The layer's image as published (packed)."""
    from rollstack.format.erofs import pack_image

    return pack_image(_raw(ref))


def test_a_published_image_is_fetched_checked_and_written_without_a_grace(tmp_path: Path) -> None:
    good = _PublishedRef(3, _image(_Ref(3)))
    asked: list[str] = []

    def fetch(ref: _PublishedRef) -> bytes:
        asked.append(ref.digest)
        return _image(ref)

    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs", grace=30.0, fetch_image=fetch).start()
    try:
        assert lowers.published([good]) and not lowers.published([_Ref(4)])
        t = time.monotonic()
        lowers.used([good])  # no ensure: a fetch does not wait for the grace
        assert lowers.wait_idle(10) and time.monotonic() - t < 5
        assert asked == [good.digest] and lowers.stats()["fetched"] == 1
        hexd = good.digest.partition(":")[2]
        assert (tmp_path / "erofs" / f"{hexd}.img").read_bytes() == _raw(good)  # unpacked
        # the mount itself fails here (no lazy store blob): the layer then stays on FUSE
        assert good.digest in lowers.failures() and not lowers.published([good])
    finally:
        lowers.stop()


def test_an_image_that_fails_its_checks_is_built_here_instead(tmp_path: Path) -> None:
    other = _image(_Ref(6))  # a valid image, of another layer
    wrong_layer = _PublishedRef(5, other)  # its digest matches the bytes: only check_image sees it
    wrong_digest = _PublishedRef(7, _image(_Ref(7)))
    from rollstack.format.erofs import MAX_IMAGE_BYTES, pack_image

    packed_bomb = pack_image(bytes(MAX_IMAGE_BYTES + 4096))
    bomb = _PublishedRef(10, packed_bomb)  # its digest is right; it unpacks past the limit
    garbage = _PublishedRef(11, b"not zstd at all")
    served = {wrong_layer.digest: other, wrong_digest.digest: _image(_Ref(7)) + b"\0",
              bomb.digest: packed_bomb, garbage.digest: b"not zstd at all"}
    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs",
                         fetch_image=lambda ref: served[ref.digest]).start()
    try:
        for ref in (wrong_layer, wrong_digest, bomb, garbage):
            assert lowers.ensure([ref], timeout=10) is False
            # nothing written from the store; the local build ran (and failed: no TOC cached)
            assert not (tmp_path / "erofs" / f"{ref.digest.partition(':')[2]}.img").exists()
            assert "not in" in lowers.failures()[ref.digest]
        assert lowers.stats()["fetched"] == 0
    finally:
        lowers.stop()


def test_a_fetch_is_never_queued_behind_a_build(tmp_path: Path) -> None:
    published = _PublishedRef(8, _image(_Ref(8)))
    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs", grace=30.0,
                         fetch_image=lambda ref: _image(ref)).start()
    try:
        lowers.used([_Ref(9)])  # a build, waiting out its 30 s grace in the build worker
        time.sleep(0.2)
        t = time.monotonic()
        lowers.used([published])
        while published.digest not in lowers.failures() and time.monotonic() - t < 10:
            time.sleep(0.02)  # fetched, then its mount fails here (no lazy store blob)
        assert time.monotonic() - t < 5 and lowers.stats()["fetched"] == 1
        assert _Ref(9).digest not in lowers.failures()  # the build is still in its grace
    finally:
        lowers.stop()


def test_an_unusable_image_is_built_by_the_build_worker_and_never_fetched_again(tmp_path: Path) -> None:
    import threading

    bad = _PublishedRef(12, b"not zstd at all")
    good = _PublishedRef(13, _image(_Ref(13)))
    asked: list[str] = []

    def fetch(ref: _PublishedRef) -> bytes:
        asked.append(ref.digest)
        return b"not zstd at all" if ref.digest == bad.digest else _image(ref)

    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs", grace=30.0, fetch_image=fetch)
    built_by: list[str] = []
    real_build = lowers._prepare

    def prepare(digest: str) -> Path:  # which worker thread builds (or fetches) the layer
        built_by.append(threading.current_thread().name)
        return real_build(digest)

    lowers._prepare = prepare  # type: ignore[method-assign]
    lowers.start()
    try:
        lowers.used([bad])
        t = time.monotonic()
        while lowers.published([bad]) and time.monotonic() - t < 10:
            time.sleep(0.02)
        assert not lowers.published([bad])  # a create no longer waits for it as for a fetch
        # handed to the build worker, which waits out its 30 s grace: not built in the fetch worker
        assert built_by == ["erofs-fetch"] and bad.digest not in lowers.failures()
        assert lowers.stats()["queued"] == 1
        lowers.used([good])  # the fetch worker is free for the next published image
        while good.digest not in lowers.failures() and time.monotonic() - t < 10:
            time.sleep(0.02)
        assert lowers.stats()["fetched"] == 1
        lowers.used([bad])  # used again: not fetched again, still the one queued build
        assert lowers.ensure([bad], timeout=10) is False  # a create waits: built now, no grace
        assert built_by.count("erofs-build") == 1 and "not in" in lowers.failures()[bad.digest]
        assert asked.count(bad.digest) == 1
    finally:
        lowers.stop()


def test_ensure_of_settled_layers_leaves_nothing_urgent(tmp_path: Path) -> None:
    """A layer already failed (or mounted) is not waited for: left in the urgent set it would
    make every later background build skip its grace and idle wait (and a fork's hold)."""
    lowers = ErofsLowers(tmp_path / "erofs", _Lazy(), tmp_path / "tocs", grace=30.0).start()
    try:
        assert lowers.ensure([_Ref(3)], timeout=10) is False  # tried now: failed
        assert lowers.ensure([_Ref(3)], timeout=10) is False  # settled: nothing to wait for
        assert not lowers._urgent_now()
        lowers.used([_Ref(4)])  # so a background build keeps its grace
        time.sleep(0.3)
        assert _Ref(4).digest not in lowers.failures()
    finally:
        lowers.stop()
