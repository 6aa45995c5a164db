"""One registry blob read front to back, downloaded ahead on a thread and digest-checked.

`group import` streams each source layer from the registry into the converter with this, so
downloading overlaps decompression and conversion instead of preceding them (`skopeo copy`
fetches the whole image first). The download thread issues ranged GETs of `block` bytes through
`RegistryStore.read_blob` (its retries and auth) into a bounded queue (`ahead` blocks), hashing
as it goes; the reader gets `IntegrityError` at the end if the bytes are not the digest's.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from rollstack.core.blocks import END, BlockPipe
from rollstack.errors import IntegrityError, RollstackError


class BlobStream:
    """A read-only, forward-only file over one blob (`read(n)` returns n bytes but at the end)."""

    def __init__(self, store: Any, repo: str, digest: str, size: int, *, block: int = 8 << 20,
                 ahead: int = 6) -> None:
        self._store, self._repo, self._digest, self._size, self._block = store, repo, digest, size, block
        self._pipe = BlockPipe(ahead)
        self._thread = threading.Thread(target=self._download, name="rollstack-blob-stream", daemon=True)
        self._thread.start()

    def _download(self) -> None:
        sha = hashlib.sha256()
        offset = 0
        try:
            while offset < self._size and not self._pipe.stopped:
                data = self._store.read_blob(self._repo, self._digest, offset, min(self._block, self._size - offset))
                if not data:
                    break
                sha.update(data)
                offset += len(data)
                self._pipe.put(data)
            got = "sha256:" + sha.hexdigest()
            if offset != self._size or got != self._digest:
                raise IntegrityError(f"blob {self._repo}@{self._digest}: downloaded {offset} of {self._size} bytes "
                                     f"hashing to {got}", digest=self._digest)
            self._pipe.put(END)
        except BaseException as exc:  # handed to the reader
            self._pipe.put(exc)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        return self._pipe.read(n)

    def close(self) -> None:
        self._pipe.stop()
        self._thread.join()

    def __enter__(self) -> "BlobStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_docker_ref(ref: str) -> tuple[str, str] | None:
    """`docker://HOST[:PORT]/NAME[:TAG|@DIGEST]` -> (host, repository), or None for references
    without an explicit registry host (Docker Hub shorthands: left to skopeo)."""
    rest = ref[len("docker://"):] if ref.startswith("docker://") else ref
    if "/" not in rest:
        return None
    host, path = rest.split("/", 1)
    if not ("." in host or ":" in host or host == "localhost"):
        return None
    path = path.split("@", 1)[0]
    last = path.rsplit("/", 1)
    if ":" in last[-1]:
        path = path.rsplit(":", 1)[0]
    return host, path


class RegistryBlobs:
    """`BlobStream`s of one repository (call it with digest, size); `close()` the client after."""

    def __init__(self, store: Any, repo: str) -> None:
        self.store, self.repo = store, repo

    def __call__(self, digest: str, size: int) -> BlobStream:
        return BlobStream(self.store, self.repo, digest, size)

    def close(self) -> None:
        self.store.close()


def open_registry_repo(ref: str, *, tls_verify: bool) -> RegistryBlobs | None:
    """Blob streams for the repository of image `ref`, or None when the registry does not
    answer our client (https first; plain http too unless `tls_verify`)."""
    from rollstack.store.registry import RegistryStore
    from rollstack.store.retry import RetryPolicy

    parsed = parse_docker_ref(ref)
    if parsed is None:
        return None
    host, repo = parsed
    for scheme in ("https", "http") if not tls_verify else ("https",):
        store = RegistryStore(f"{scheme}://{host}", verify=tls_verify, retry=RetryPolicy(retries=2, deadline=20.0))
        try:
            store.list_tags(repo)  # reachable, speaks the distribution API, we may read the repo
        except (RollstackError, OSError):
            store.close()
            continue
        return RegistryBlobs(store, repo)
    return None
