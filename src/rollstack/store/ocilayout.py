"""`OciLayoutStore`: the embedded store, an OCI image layout directory on local disk (no server).

Layout (standard OCI image layout plus one hidden directory of our own):

    ROOT/oci-layout                      {"imageLayoutVersion": "1.0.0"}
    ROOT/index.json                      one descriptor per (repository, tag) or untagged manifest,
                                         annotations `io.rollstack.repository` = repository and
                                         `org.opencontainers.image.ref.name` = tag
    ROOT/blobs/sha256/<hex>              every blob and manifest, content-addressed, shared
    ROOT/.rollstack/repos/<repo>/_blobs/<hex>   empty link files: "repository holds this blob"
    ROOT/.rollstack/lock                 flock serialising index.json updates across processes
    ROOT/.rollstack/tmp/                 temp files, renamed into place (same filesystem)

The link files make blob membership per repository exactly like a registry (a blob pushed to
`a` is not readable through `b` until it is put there, which then costs no bytes: the local
equivalent of a cross-repository mount). `_blobs` cannot collide with a repository path
component (those never start with `_`). Writes are temp file + fsync + rename; index.json is
read-modify-written under an exclusive flock, so several processes can share one store.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from rollstack.errors import BlobNotFound, IntegrityError, InvalidRequest, ManifestNotFound
from rollstack.store import names
from rollstack.store.base import Manifest

REPO_ANNOTATION = "io.rollstack.repository"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
_COPY_BLOCK = 1 << 20
_FILE_MODE = 0o644  # mkstemp makes 0600; a store is content-addressed data anyone may read


class OciLayoutStore:
    """An OCI image layout directory holding many repositories. Thread- and process-safe."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = f"oci:{self.root}"
        self._blobs = self.root / "blobs" / "sha256"
        self._meta = self.root / ".rollstack"
        self._tmp = self._meta / "tmp"
        self._thread_lock = threading.Lock()
        for d in (self._blobs, self._meta / "repos", self._tmp):
            d.mkdir(parents=True, exist_ok=True)
        if (self.root / "oci-layout").exists() and (self.root / "index.json").exists():
            return  # an existing store: readable without write access
        with self._index_lock():
            if not (self.root / "oci-layout").exists():
                self._write_atomic(self.root / "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
            if not (self.root / "index.json").exists():
                self._write_index([])

    def __repr__(self) -> str:
        return f"OciLayoutStore({str(self.root)!r})"

    def __enter__(self) -> "OciLayoutStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- blobs -------------------------------------------------------------------------------

    def has_blob(self, repo: str, digest: str) -> bool:
        return self._link(repo, digest).exists() and self._blob(digest).exists()

    def blob_size(self, repo: str, digest: str) -> int:
        self._require_blob(repo, digest)
        try:
            return self._blob(digest).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {repo}", repo=repo, digest=digest) from None

    def read_blob(self, repo: str, digest: str, offset: int, length: int) -> bytes:
        names.check_range(offset, length)
        self._require_blob(repo, digest)
        try:
            fd = os.open(self._blob(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not found in {repo}", repo=repo, digest=digest) from None
        try:
            # clamp first: a huge `length` must not become a huge buffer
            length = max(0, min(length, os.fstat(fd).st_size - offset))
            parts = []
            while length > 0:  # pread may return short on huge reads; loop until EOF
                got = os.pread(fd, length, offset)
                if not got:
                    break
                parts.append(got)
                offset += len(got)
                length -= len(got)
            return b"".join(parts)
        finally:
            os.close(fd)

    def put_blob(self, repo: str, digest: str, data: bytes | Path | BinaryIO) -> bool:
        names.check_repo(repo)
        names.check_digest(digest)
        if self._blob(digest).exists():
            self._add_link(repo, digest)  # held by another repository: link, no bytes
            return False
        tmp = self._write_verified(digest, data)
        try:
            os.replace(tmp, self._blob(digest))
        finally:
            tmp.unlink(missing_ok=True)
        self._add_link(repo, digest)
        return True

    # -- manifests ---------------------------------------------------------------------------

    def put_manifest(self, repo: str, ref: str, data: bytes, media_type: str) -> str:
        data, digest, blobs, children = names.check_manifest_put(repo, ref, data, media_type)
        for d in blobs:
            if not self.has_blob(repo, d):
                raise BlobNotFound(f"manifest references blob {d} not in {repo}", repo=repo, digest=d)
        for d in children:
            if not self.has_manifest(repo, d):
                raise ManifestNotFound(f"index references manifest {d} not in {repo}", repo=repo, digest=d)
        if not self._blob(digest).exists():
            self.put_blob(repo, digest, data)
        self._add_link(repo, digest)
        tag = None if names.is_digest(ref) else ref
        with self._index_lock():
            entries = self._read_index()
            self._write_index(_retag(entries, repo, tag, digest, media_type, len(data)))
        return digest

    def get_manifest(self, repo: str, ref: str) -> Manifest:
        desc = self._find(repo, ref)
        try:
            data = self._blob(desc["digest"]).read_bytes()
        except FileNotFoundError:
            raise ManifestNotFound(f"manifest {repo}:{ref} has no blob", repo=repo, ref=ref) from None
        if names.sha256_digest(data) != desc["digest"]:
            raise IntegrityError(f"manifest blob {desc['digest']} is corrupt", digest=desc["digest"])
        return Manifest(digest=desc["digest"], media_type=desc["mediaType"], data=data)

    def has_manifest(self, repo: str, ref: str) -> bool:
        try:
            self._find(repo, ref)
        except ManifestNotFound:
            return False
        return True

    def delete_manifest(self, repo: str, digest: str) -> None:
        """Removes the manifest and every tag pointing at it (registry semantics)."""
        names.check_repo(repo)
        names.check_digest(digest)
        with self._index_lock():
            entries = self._read_index()
            kept = [e for e in entries if not ((e.get("annotations") or {}).get(REPO_ANNOTATION) == repo and e["digest"] == digest)]
            if len(kept) == len(entries):
                raise ManifestNotFound(f"manifest {repo}@{digest} not found", repo=repo, ref=digest)
            self._write_index(kept)

    def delete_blob(self, repo: str, digest: str) -> None:
        """Unlinks the blob from the repository. Bytes stay in blobs/ (other repositories may
        share them); reclaiming storage is a separate garbage collection, as on a registry."""
        self._require_blob(repo, digest)
        self._link(repo, digest).unlink(missing_ok=True)

    def list_tags(self, repo: str) -> list[str]:
        names.check_repo(repo)
        return sorted(
            {a[REF_ANNOTATION] for a in _annotations(self._read_index()) if a.get(REPO_ANNOTATION) == repo and REF_ANNOTATION in a}
        )

    def list_repositories(self) -> list[str]:
        repos = {a[REPO_ANNOTATION] for a in _annotations(self._read_index()) if REPO_ANNOTATION in a}
        base = self._meta / "repos"
        for dirpath, dirnames, _ in os.walk(base):
            if "_blobs" in dirnames:
                dirnames.remove("_blobs")  # never descend into the (large) link directories
                repos.add(Path(dirpath).relative_to(base).as_posix())
        return sorted(repos)

    def close(self) -> None:
        pass

    # -- internals ---------------------------------------------------------------------------

    def _blob(self, digest: str) -> Path:
        return self._blobs / names.digest_hex(digest)

    def _link(self, repo: str, digest: str) -> Path:
        return self._meta / "repos" / names.check_repo(repo) / "_blobs" / names.digest_hex(digest)

    def _add_link(self, repo: str, digest: str) -> None:
        link = self._link(repo, digest)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.touch(exist_ok=True)

    def _require_blob(self, repo: str, digest: str) -> None:
        if not self._link(repo, digest).exists():
            raise BlobNotFound(f"blob {digest} not found in {repo}", repo=repo, digest=digest)

    def _find(self, repo: str, ref: str) -> dict[str, Any]:
        names.check_repo(repo)
        names.check_ref(ref)
        key = "digest" if names.is_digest(ref) else "tag"
        for desc in self._read_index():
            ann = desc.get("annotations") or {}
            if ann.get(REPO_ANNOTATION) != repo:
                continue
            if (key == "digest" and desc.get("digest") == ref) or (key == "tag" and ann.get(REF_ANNOTATION) == ref):
                return desc
        raise ManifestNotFound(f"manifest {repo}:{ref} not found", repo=repo, ref=ref)

    def _write_verified(self, digest: str, data: bytes | Path | BinaryIO) -> Path:
        """Copies data to a temp file while hashing; IntegrityError (and no file) on mismatch.
        A file on the same filesystem is hardlinked instead of copied (then hashed in place):
        blobs are immutable, and `group import` hands over multi-GB converted layers."""
        linked = self._link_verified(digest, data)
        if linked is not None:
            return linked
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix="blob-")
        os.fchmod(fd, _FILE_MODE)
        tmp = Path(name)
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for block in _blocks(data):
                    h.update(block)
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
            _check_digest(h, digest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _link_verified(self, digest: str, data: bytes | Path | BinaryIO) -> Path | None:
        if not isinstance(data, (str, os.PathLike)):
            return None
        src = Path(data)
        try:
            if not src.is_file() or src.stat().st_dev != self._tmp.stat().st_dev:
                return None
            tmp = self._tmp / f"blob-link-{os.getpid()}-{threading.get_ident()}-{src.stat().st_ino}"
            tmp.unlink(missing_ok=True)
            os.link(src, tmp)
        except OSError:  # e.g. a filesystem without hardlinks: copy instead
            return None
        try:
            h = hashlib.sha256()
            with open(tmp, "rb") as f:
                for block in names.stream_blocks(f, _COPY_BLOCK):
                    h.update(block)
                os.fsync(f.fileno())
            if stat.S_IMODE(os.stat(tmp).st_mode) != _FILE_MODE:
                os.chmod(tmp, _FILE_MODE)
            _check_digest(h, digest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    @contextmanager
    def _index_lock(self) -> Iterator[None]:
        with self._thread_lock, open(self._meta / "lock", "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _read_index(self) -> list[dict[str, Any]]:
        try:
            doc = json.loads((self.root / "index.json").read_bytes())
        except FileNotFoundError:
            return []
        except ValueError as exc:
            raise IntegrityError(f"{self.root / 'index.json'} is not valid JSON: {exc}") from None
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        return [m for m in manifests or [] if isinstance(m, dict) and isinstance(m.get("digest"), str)]

    def _write_index(self, entries: list[dict[str, Any]]) -> None:
        doc = {"schemaVersion": 2, "mediaType": names.OCI_INDEX, "manifests": entries}
        self._write_atomic(self.root / "index.json", json.dumps(doc, indent=1).encode())

    def _write_atomic(self, path: Path, data: bytes) -> None:
        fd, name = tempfile.mkstemp(dir=self._tmp, prefix=path.name + "-")
        os.fchmod(fd, _FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(name, path)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise


def _check_digest(h: Any, digest: str) -> None:
    """IntegrityError unless the sha256 `h` of the bytes written is `digest`."""
    got = "sha256:" + h.hexdigest()
    if got != digest:
        raise IntegrityError(f"blob bytes hash to {got}, not {digest}", digest=digest)


def _annotations(entries: list[dict[str, Any]]) -> Iterator[dict[str, str]]:
    for e in entries:
        yield e.get("annotations") or {}


def _retag(entries: list[dict[str, Any]], repo: str, tag: str | None, digest: str, media_type: str, size: int) -> list[dict[str, Any]]:
    """The index after pointing (repo, tag) at digest (tag None: just record the manifest).

    Like a registry, a manifest stays reachable by digest after its tag moves away: an untagged
    entry keeps it. At most one entry per (repo, tag) and one untagged entry per (repo, digest)
    that no tag references."""

    def repo_of(e: dict[str, Any]) -> str | None:
        return (e.get("annotations") or {}).get(REPO_ANNOTATION)

    def tag_of(e: dict[str, Any]) -> str | None:
        return (e.get("annotations") or {}).get(REF_ANNOTATION)

    out = [e for e in entries if not (repo_of(e) == repo and tag is not None and tag_of(e) == tag)]
    displaced = {e["digest"] for e in entries if e not in out}
    annotations = {REPO_ANNOTATION: repo}
    if tag is not None:
        annotations[REF_ANNOTATION] = tag
    out.append({"mediaType": media_type, "digest": digest, "size": size, "annotations": annotations})
    # keep displaced manifests reachable; drop untagged duplicates of tagged manifests
    held = {(repo_of(e), e["digest"]) for e in out if tag_of(e) is not None}
    for d in displaced:
        if (repo, d) not in held and not any(repo_of(e) == repo and e["digest"] == d for e in out):
            old = next(e for e in entries if repo_of(e) == repo and e["digest"] == d)
            out.append({"mediaType": old["mediaType"], "digest": d, "size": old.get("size", 0), "annotations": {REPO_ANNOTATION: repo}})
    result, seen_untagged = [], set()
    for e in out:
        key = (repo_of(e), e["digest"])
        if tag_of(e) is None:
            if key in held or key in seen_untagged:
                continue
            seen_untagged.add(key)
        result.append(e)
    return result


def _blocks(data: bytes | Path | BinaryIO) -> Iterator[bytes]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
    elif isinstance(data, (str, os.PathLike)):
        if not Path(data).is_file():
            raise InvalidRequest(f"no such file {data}")
        with open(data, "rb") as f:
            yield from names.stream_blocks(f, _COPY_BLOCK)
    elif hasattr(data, "read"):
        yield from names.stream_blocks(data, _COPY_BLOCK)
    else:
        raise InvalidRequest(f"blob data must be bytes, a path or a binary file, not {type(data).__name__}")


__all__ = ["OciLayoutStore", "REPO_ANNOTATION", "REF_ANNOTATION"]
