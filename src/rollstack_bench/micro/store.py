"""`python -m rollstack_bench.micro.store [MiB]`: side-by-side throughput of both stores.

Uploads one random blob to an OCI layout and to a fresh loopback docker-registry, then times
1 MiB range reads (sequential and 32 threads), 4 KiB read latency and a chunked upload.
Prints the machine facts and the command; numbers go into docs/store.md.
"""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rollstack.store.base import ArtifactStore
from rollstack.store.ocilayout import OciLayoutStore
from rollstack.store.registry import RegistryStore
from rollstack.store.server import RegistryServer

REPO = "bench/blob"


def _measure(store: ArtifactStore, path: Path, digest: str, size: int) -> dict[str, float]:
    t = time.perf_counter()
    store.put_blob(REPO, digest, path)
    upload = time.perf_counter() - t
    spans = [(i << 20, 1 << 20) for i in range(size >> 20)]
    t = time.perf_counter()
    for off, n in spans:
        store.read_blob(REPO, digest, off, n)
    seq = time.perf_counter() - t
    with ThreadPoolExecutor(32) as pool:
        t = time.perf_counter()
        for _ in pool.map(lambda s: len(store.read_blob(REPO, digest, *s)), spans):
            pass  # keep nothing: RSS shows what the store holds
        par = time.perf_counter() - t
    small = [(i * 7919 % (size - 4096), 4096) for i in range(500)]
    t = time.perf_counter()
    for off, n in small:
        store.read_blob(REPO, digest, off, n)
    lat = (time.perf_counter() - t) / len(small)
    mb = size / 1e6
    return {"upload_MBps": mb / upload, "seq_1MiB_MBps": mb / seq, "par32_1MiB_MBps": mb / par, "read_4KiB_ms": lat * 1e3}


def main(argv: list[str]) -> None:
    size = (int(argv[0]) if argv else 64) << 20
    print(f"command: python -m rollstack_bench.micro.store {size >> 20}")
    print(f"machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}, {platform.platform()}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        path = d / "blob"
        h = hashlib.sha256()
        with open(path, "wb") as f:
            for _ in range(size >> 20):
                block = os.urandom(1 << 20)
                h.update(block)
                f.write(block)
        digest = "sha256:" + h.hexdigest()
        rows = {"oci": _measure(OciLayoutStore(d / "oci"), path, digest, size)}
        with RegistryServer(d / "reg") as server:
            with RegistryStore(server.url) as store:
                rows["registry"] = _measure(store, path, digest, size)
            with RegistryStore(server.url, chunk_size=8 << 20) as store:
                t = time.perf_counter()
                store.put_blob("bench/chunked", digest, path)
                chunked = size / 1e6 / (time.perf_counter() - t)
                patches = store.stats.requests["PATCH"]
    for name, r in rows.items():
        print(f"{name:9s} upload {r['upload_MBps']:6.0f} MB/s | 1 MiB reads: sequential {r['seq_1MiB_MBps']:6.0f} MB/s, "
              f"32 threads {r['par32_1MiB_MBps']:6.0f} MB/s | 4 KiB read {r['read_4KiB_ms']:.2f} ms")
    print(f"registry chunked upload ({patches} x 8 MiB PATCH): {chunked:.0f} MB/s")
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (blob {size >> 20} MiB, streamed)")


if __name__ == "__main__":
    main(sys.argv[1:])
