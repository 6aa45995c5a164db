"""The image `rollstack bench import` imports by default: built the ordinary way, one gzip layer.

Debian bookworm minbase (debootstrap) + python3/pip + a scientific/test stack pip-installed into
the system site-packages, packed as ONE `tar --sort=name --format=pax | gzip -6` layer in an OCI
image layout (like `docker build` with one RUN, or `umoci repack`). Built once, cached under the
bench cache dir (`~/.cache/rollstack_bench/import-image-<hash>/`, keyed by the recipe), so reruns
start at once. Needs root, debootstrap, network to the Debian mirror and PyPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rollstack.errors import InvalidRequest, RuntimeFailure

CACHE = Path.home() / ".cache" / "rollstack" / "bench"
MIRROR = "http://deb.debian.org/debian"
DEBS = ("python3", "python3-pip", "python3-venv", "ca-certificates", "git")
PIP = ("numpy==1.26.4", "pandas==2.2.3", "scipy==1.13.1", "sympy==1.13.3", "pytest==8.3.3",
       "hypothesis==6.115.0", "requests==2.32.3", "jinja2==3.1.4", "pyyaml==6.0.2")
TAG = "bench"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _log(msg: str) -> None:
    print(f"[bench import] {msg}", file=sys.stderr, flush=True)


def recipe_key() -> str:
    return hashlib.sha256(json.dumps([DEBS, PIP, "v1"]).encode()).hexdigest()[:12]


def default_image(cache: Path = CACHE) -> Path:
    """The cached OCI layout (built on first use); import it as `oci:PATH:bench`."""
    dest = cache / f"import-image-{recipe_key()}"
    if (dest / "index.json").is_file():
        return dest
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise InvalidRequest("building the benchmark image needs root and debootstrap; pass --image")
    work = cache / f"import-image-{recipe_key()}.tmp"
    _remove(work)
    root = work / "rootfs"
    cache.mkdir(parents=True, exist_ok=True)
    _log(f"building {dest} (debootstrap + pip; once, cached)")
    _run(["debootstrap", "--variant=minbase", f"--cache-dir={_debs(cache)}", f"--include={','.join(DEBS)}",
          "bookworm", str(root), MIRROR], "debootstrap")
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    shutil.copy(HOST_CA_BUNDLE, root / "tmp/host-ca.crt")  # the host's CAs (a TLS proxy may sit in between)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
           "PIP_INDEX_URL": "https://pypi.org/simple", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_ROOT_USER_ACTION": "ignore", "PIP_DEFAULT_TIMEOUT": "120", "PIP_CERT": "/tmp/host-ca.crt"}
    _run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), shutil.which("chroot") or "/usr/sbin/chroot", str(root),
          "pip", "install", "--break-system-packages", *PIP], "pip install")
    _run(["chroot", str(root), "sh", "-c", "apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/host-ca.crt /root/.cache "
          "&& : > /etc/resolv.conf"], "cleanup")
    _remove(work / "layout")
    write_layout(root, work / "layout")
    (work / "layout").rename(dest)
    _remove(work)
    return dest


def _remove(path: Path) -> None:
    """rm -rf, refusing while anything is mounted below (debootstrap mounts proc/sys in the
    target while it runs; an interrupted build can leave them)."""
    prefix = str(path.resolve()) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    busy = [m for m in mounts if m.startswith(prefix)]
    if busy:
        raise RuntimeFailure(f"cannot remove {path}: {busy[0]} is mounted there (unmount it first)")
    shutil.rmtree(path, ignore_errors=True)


def _debs(cache: Path) -> Path:
    d = cache / "_debs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeFailure(f"{what} failed:\n{proc.stdout.decode(errors='replace')[-2000:]}")


def write_layout(rootfs: Path, layout: Path, tag: str = TAG) -> dict[str, int]:
    """`rootfs` as a one-layer gzip OCI image at `layout` (tar + gzip -6, digests on the fly)."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    tmp = layout / "layer.tmp"
    tar = subprocess.Popen(["tar", "--one-file-system", "--sort=name", "--format=pax", "--xattrs", "--xattrs-include=*", "--numeric-owner",
                            "-cf", "-", "-C", str(rootfs), "."], stdout=subprocess.PIPE)
    with open(tmp, "wb") as out:
        gz = subprocess.Popen(["gzip", "-6", "-n"], stdin=subprocess.PIPE, stdout=out)
        raw, raw_size = hashlib.sha256(), 0
        assert tar.stdout is not None and gz.stdin is not None
        while block := tar.stdout.read(1 << 20):
            raw.update(block)
            raw_size += len(block)
            gz.stdin.write(block)
        gz.stdin.close()
        if tar.wait() != 0 or gz.wait() != 0:
            raise RuntimeFailure("packing the benchmark image failed (tar | gzip)")
    layer = _put(blobs, tmp)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + raw.hexdigest()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **_put_bytes(blobs, config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }).encode()
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                **_put_bytes(blobs, manifest),
                                                "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps(index))
    return {"unpacked_bytes": raw_size, "layer_bytes": layer["size"]}


def _put(blobs: Path, path: Path) -> dict[str, object]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    size = path.stat().st_size
    path.rename(blobs / h.hexdigest())
    return {"digest": f"sha256:{h.hexdigest()}", "size": size}


def _put_bytes(blobs: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}
