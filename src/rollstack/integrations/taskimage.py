"""A container task's image as a rollstack layer group (the Harbor provider's, docs/harbor.md).

A task names its image one of two ways, as Harbor's `task.toml` does:
- `docker_image`: a reference `group import` reads (`oci:DIR[:TAG]`, `docker://HOST/NAME:TAG`,
  or `HOST/NAME:TAG`, taken as docker://), imported as it is;
- `environment/Dockerfile`: built without a Docker daemon by buildah (chroot isolation, vfs
  storage of its own under the cache directory: no mounts), pushed to an OCI layout, imported.

Either way the group is `harbor/<environment name>:<key>`, the key a digest of what defines the
image (the reference, or every file of the build context), so a task is built and imported once
per definition: later starts, in any process, find it in the cache (`force_build` redoes it).
Concurrent starts of one task wait for the first one's build (a file lock per key). The image's
config gives the plan its `env` (PATH...), `workdir` and user.

The conversion itself is the `rollstack` CLI's (`group import`, run as a subprocess): a provider
living in another Python (Harbor needs 3.12) imports only the SDK of this package.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollstack.errors import InvalidRequest, RuntimeFailure

GROUP_PREFIX = "harbor"
_TRANSPORTS = ("oci:", "docker://", "oci-archive:", "docker-archive:", "dir:")


@dataclass
class TaskImage:
    """A task's image, imported: the group and what the plan takes from the image's config."""

    group: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""

    def plan(self, name: str, workdir: str | None = None, env: dict[str, str] | None = None,
             cpus: float | None = None, memory_mb: int | None = None, network: str = "outbound",
             timeout: float = 24 * 3600) -> dict[str, Any]:
        """A plan over the image (the task's own workdir and env win over the image's)."""
        resources: dict[str, Any] = {}
        if cpus:
            resources["cpu"] = float(cpus)
        if memory_mb:
            resources["memory"] = f"{int(memory_mb)}Mi"
        doc: dict[str, Any] = {"name": name, "groups": [self.group], "workdir": workdir or self.workdir or "/",
                               "env": {**self.env, **(env or {})}, "network": network, "timeout": timeout}
        if resources:
            doc["resources"] = resources
        return doc


def image_ref(docker_image: str) -> str:
    """`docker_image` as a reference `group import` and skopeo take (a bare NAME:TAG is docker://)."""
    ref = docker_image.strip()
    if not ref or any(c.isspace() for c in ref):
        raise InvalidRequest(f"docker_image {docker_image!r} is not an image reference")
    return ref if ref.startswith(_TRANSPORTS) else f"docker://{ref}"


def context_key(context: Path) -> str:
    """A digest of a build context: every file's relative path, mode and bytes, and every
    symlink's target, in sorted order (timestamps do not count)."""
    h = hashlib.sha256()
    for path in sorted(context.rglob("*")):
        rel = path.relative_to(context).as_posix()
        st = path.lstat()
        h.update(f"{rel}\0{st.st_mode:o}\0".encode())
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        elif path.is_file():
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def image_key(environment_dir: Path, docker_image: str | None) -> tuple[str, str]:
    """(key, source): what defines the task's image. A Dockerfile in `environment_dir` wins over
    `docker_image` only when there is no `docker_image` (Harbor's rule: a prebuilt image is used
    unless a build is forced)."""
    if docker_image:
        ref = image_ref(docker_image)
        return hashlib.sha256(f"ref\0{ref}".encode()).hexdigest(), ref
    if (environment_dir / "Dockerfile").is_file():
        return hashlib.sha256(f"build\0{context_key(environment_dir)}".encode()).hexdigest(), "Dockerfile"
    raise InvalidRequest(f"{environment_dir} has no Dockerfile and the task names no docker_image")


def group_name(environment_name: str, key: str) -> str:
    """`harbor/<name>:<key prefix>`, the name lowercased to what a repository allows."""
    name = re.sub(r"[^a-z0-9]+", "-", environment_name.lower()).strip("-")[:80] or "task"
    return f"{GROUP_PREFIX}/{name}:k{key[:20]}"


def config_of(inspect: dict[str, Any]) -> tuple[dict[str, str], str, str]:
    """(env, workdir, user) from an image config (`skopeo inspect --config`)."""
    cfg = inspect.get("config") or {}
    env: dict[str, str] = {}
    for item in cfg.get("Env") or []:
        k, sep, v = str(item).partition("=")
        if sep and k:
            env[k] = v
    return env, str(cfg.get("WorkingDir") or "/"), str(cfg.get("User") or "")


@dataclass
class ImageBuilder:
    """Builds and imports task images into the node's store (the CLI's `group import`)."""

    store: str
    """The node's store: `oci:PATH`, a path, or the registry's http(s) URL."""
    cache_dir: Path
    """Keys already imported (`images/KEY.json`), locks, the import cache and each build's
    temporary directory (buildah's storage lives and dies with it)."""
    cli: str = "rollstack"
    """The rollstack CLI (of the Python rollstack runs in)."""
    timeout: float = 3600.0

    def ensure(self, environment_dir: Path, environment_name: str, docker_image: str | None = None,
               force_build: bool = False) -> TaskImage:
        """The task's image imported as a group (built first if it is a Dockerfile)."""
        key, source = image_key(environment_dir, docker_image)
        meta = self._meta(key)
        meta.parent.mkdir(parents=True, exist_ok=True)
        with (self.cache_dir / "images" / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key; the others wait and reuse it
            if meta.exists() and not force_build:
                try:
                    return TaskImage(**json.loads(meta.read_text()))
                except (ValueError, TypeError):
                    pass  # a torn or older record: build again
            group = group_name(environment_name, key)
            with tempfile.TemporaryDirectory(prefix="rs-harbor-", dir=self.cache_dir) as tmp:
                ref = self._build(environment_dir, key, Path(tmp)) if source == "Dockerfile" else source
                env, workdir, user = config_of(json.loads(self._run(["skopeo", "inspect", "--config", ref])))
                self._run([self.cli, "group", "import", ref, group, "--store", self.store,
                           "--cache-dir", str(self.cache_dir / "import-cache")])
            image = TaskImage(group=group, env=env, workdir=workdir, user=user)
            tmp_meta = meta.with_suffix(".tmp")
            tmp_meta.write_text(json.dumps(asdict(image)))
            tmp_meta.replace(meta)
            return image

    def forget(self, environment_dir: Path, docker_image: str | None = None) -> None:
        """Drop the cache record of this task's image (the store lost its group): rebuilt next time."""
        key, _ = image_key(environment_dir, docker_image)
        self._meta(key).unlink(missing_ok=True)

    def _meta(self, key: str) -> Path:
        """The cache record of image `key` in this store (another store has its own)."""
        store = hashlib.sha256(self.store.encode()).hexdigest()[:12]
        return self.cache_dir / "images" / f"{key}.{store}.json"

    def _build(self, context: Path, key: str, out: Path) -> str:
        """buildah bud of `context` into an OCI layout under `out`; its reference."""
        if shutil.which("buildah") is None:
            raise RuntimeFailure("building a task's Dockerfile needs buildah (Debian package buildah)")
        # vfs: no mount outlives a build, even a failed or killed one (overlay storage keeps its
        # home and failed builds' containers mounted); costs a copy of the tree per layer, once.
        # The storage is the build's own, under `out` (removed with it): nothing accumulates
        # across builds, and concurrent builds of other keys share nothing.
        storage = ["--root", str(out / "storage"), "--runroot", str(out / "run"), "--storage-driver", "vfs"]
        tag = f"localhost/rs-harbor-{key[:20]}:latest"
        self._run(["buildah", *storage, "bud", "--isolation", "chroot", "-q",
                   "-f", str(context / "Dockerfile"), "-t", tag, str(context)])
        ref = f"oci:{out / 'image'}:latest"
        self._run(["buildah", *storage, "push", tag, ref])
        return ref

    def _run(self, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeFailure(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise RuntimeFailure(f"{' '.join(argv[:3])} ... exited {done.returncode}: {tail}")
        return done.stdout
