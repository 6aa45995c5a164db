"""A private containerd daemon (the engine under Docker) and a thin `ctr` wrapper.

`PrivateContainerd(state_dir)` starts `containerd --config X` with its own root, state, socket
and the overlayfs snapshotter, CRI disabled, so it never touches a system containerd. Used as a
context manager; the daemon (and every shim it started) is stopped on exit. `Ctr` runs `ctr -a
SOCK` commands: pull (plain HTTP), create/start/delete containers, and clear every image,
content blob and snapshot for cold runs.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rollstack.errors import RuntimeFailure
from rollstack.host import mountinfo
from rollstack.host.umount import detach

log = logging.getLogger(__name__)

NAMESPACE = "rs-bench"
SNAPSHOTTER = "overlayfs"


def _config(root: Path) -> str:
    return f"""version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{root}/containerd.sock"

[ttrpc]
  address = "{root}/containerd-ttrpc.sock"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 0
"""


class PrivateContainerd:
    """containerd with everything under `state_dir` (keep it short: socket paths max 108 bytes)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.socket = state_dir / "containerd.sock"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None

    def __enter__(self) -> "Ctr":
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "config.toml"
        cfg.write_text(_config(self.dir))
        self._log = open(self.dir / "containerd.log", "ab")
        self._proc = subprocess.Popen(["containerd", "--config", str(cfg)], stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        ctr = Ctr(self.socket)
        deadline = time.monotonic() + 30
        while True:
            if self._proc.poll() is not None:
                self.close()
                raise RuntimeFailure(f"containerd exited ({self.dir / 'containerd.log'})")
            if self.socket.exists() and ctr.ok():
                return ctr
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeFailure("containerd did not come up in 30s")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is not None:
            if self.socket.exists():
                Ctr(self.socket).remove_all_containers()
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGTERM)
                try:
                    self._proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                    self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        _unmount_below(self.dir)


def _unmount_below(path: Path) -> None:
    """Unmount anything a killed daemon left mounted under `path` (deepest first)."""
    for t in sorted(mountinfo.mounts_under(path.resolve()), key=len, reverse=True):
        try:
            detach(t)
        except RuntimeFailure as exc:  # best effort: the next start reports what is still there
            log.warning("could not detach %s: %s", t, exc)


@dataclass(frozen=True)
class Ctr:
    """`ctr -a SOCK -n rs-bench ...` commands (blocking)."""

    socket: Path

    def _cmd(self, *args: str) -> list[str]:
        return ["ctr", "-a", str(self.socket), "-n", NAMESPACE, *args]

    def run(self, *args: str, timeout: float = 900.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        # stdin closed: an attached `tasks start` forwards ours, and a command reading it would hang
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeFailure(f"ctr {' '.join(args[:3])}: {proc.stderr.strip()[-1500:] or proc.stdout.strip()[-1500:]}")
        return proc

    def ok(self) -> bool:
        try:
            return subprocess.run(self._cmd("version"), capture_output=True, timeout=5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def pull(self, ref: str) -> None:
        """Pull and unpack into the overlayfs snapshotter (what `docker pull` does)."""
        self.run("images", "pull", "--plain-http", "--snapshotter", SNAPSHOTTER, ref)

    def has_image(self, ref: str) -> bool:
        return ref in self.run("images", "ls", "-q").stdout.split()

    def create(self, ref: str, cid: str, cmd: Sequence[str], mounts: Sequence[tuple[str, str]] = ()) -> None:
        args = ["containers", "create", "--snapshotter", SNAPSHOTTER]
        for src, dst in mounts:
            args += ["--mount", f"type=bind,src={src},dst={dst},options=rbind:ro"]
        self.run(*args, "--", ref, cid, *cmd)  # `--`: the command's own flags (sh -c) are not ctr's

    def start(self, cid: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        """Start the container's task attached; returns when its process exits."""
        return self.run("tasks", "start", cid, timeout=timeout, check=False)

    def delete(self, cid: str) -> None:
        self.run("tasks", "delete", "-f", cid, check=False)
        self.run("containers", "delete", cid, check=False)

    def remove_all_containers(self) -> None:
        for cid in self.run("containers", "ls", "-q", check=False).stdout.split():
            self.run("tasks", "kill", "-s", "SIGKILL", cid, check=False)
            self.delete(cid)

    def clear(self) -> None:
        """Remove every container, image, content blob and snapshot (cold start)."""
        self.remove_all_containers()
        images = self.run("images", "ls", "-q", check=False).stdout.split()
        if images:
            self.run("images", "rm", "--sync", *images, check=False)
        for _ in range(3):
            digests = [l.split()[0] for l in self.run("content", "ls", "-q", check=False).stdout.splitlines() if l.strip()]
            if not digests:
                break
            self.run("content", "rm", *digests, check=False)
        for _ in range(5):  # snapshots go child-first
            snaps = [l.split()[0] for l in self.run("snapshots", "--snapshotter", SNAPSHOTTER, "ls", check=False).stdout.splitlines()[1:] if l.strip()]
            if not snaps:
                break
            for s in snaps:
                self.run("snapshots", "--snapshotter", SNAPSHOTTER, "rm", s, check=False)


def drop_page_cache() -> None:
    """sync + drop clean page cache, dentries and inodes (cold runs)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise RuntimeFailure(f"cannot drop the page cache: {exc}") from exc


def available() -> str | None:
    """None if containerd/ctr/runc are usable here, else why not."""
    for binary in ("containerd", "ctr", "runc", "containerd-shim-runc-v2"):
        if shutil.which(binary) is None:
            return f"{binary} not installed"
    return None


def oci_archive(tree: Path, out: Path, image: str) -> None:
    """A one-layer OCI image archive of `tree`, named `image` (for `ctr images import`)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for p in sorted(tree.rglob("*")):
            t.add(p, arcname=str(p.relative_to(tree)), recursive=False)
    layer_b = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_b).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (layer_b, config)}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                                      "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                       "digest": diff_id, "size": len(layer_b)}]}).encode()
    blobs[hashlib.sha256(manifest).hexdigest()] = manifest
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(), "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": image,
                        "io.containerd.image.name": image}}]}).encode()
    with tarfile.open(out, "w") as t:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                           *[(f"blobs/sha256/{d}", b) for d, b in blobs.items()]]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
