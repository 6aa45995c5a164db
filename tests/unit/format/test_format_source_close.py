"""`FileBlobSource.close`: the descriptor is closed once, however many threads close it."""

from __future__ import annotations

import os
import threading
import time

from rollstack.format.source import FileBlobSource


def test_racing_closes_close_the_descriptor_once(tmp_path, monkeypatch):
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 64)
    real_close = os.close
    calls: list[int] = []

    def slow_close(n: int) -> None:
        calls.append(n)
        time.sleep(0.01)  # a second closer gets in while the first is inside os.close
        real_close(n)

    for _ in range(10):
        src = FileBlobSource(blob)
        assert src.read_at(0, 4) == b"xxxx"
        n = src._fd
        calls.clear()
        barrier = threading.Barrier(4)

        def closer(src: FileBlobSource = src) -> None:
            barrier.wait()
            src.close()

        monkeypatch.setattr(os, "close", slow_close)
        threads = [threading.Thread(target=closer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        monkeypatch.setattr(os, "close", real_close)
        assert calls == [n]
        del src  # __del__ closes again: nothing left to close
        assert calls == [n]
