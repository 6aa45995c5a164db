"""Single-layer project images for `rollstack bench init --image`, built the way a user would.

Each image is Debian bookworm minbase (debootstrap) plus a project installed from PyPI or npm,
packed as **one** gzip tar layer (what `docker build` with one RUN or `umoci` produce) into an
OCI image layout `<cache>/images/<name>` tagged `latest`. The benchmarks were never tuned to
these images: they exist so `bench init --image` is checked on something other than the corpus.

| name | content | command |
|---|---|---|
| `python-project` | minbase + python3/pip/git + pytest, hypothesis, requests, rich, pydantic, numpy, attrs (system site-packages) | `python3 -c "import pytest, hypothesis, requests, rich, pydantic, numpy"` |
| `node-project` | minbase + Debian's nodejs + an npm project at /app with express, lodash, typescript, jest | `cd /app && node -e "require('express'); require('lodash'); require('typescript'); require('jest')"` |
| `web-project` | minbase + python3 and libpq with a web stack (Django, Flask, SQLAlchemy, Jinja2, gunicorn, psycopg, pytest; pip, system site-packages) + Debian's nodejs + an npm front end at /app (react, react-dom, vite, eslint); added in the twelfth pass, after every optimization it is measured against | `python3 -c "import django, flask, sqlalchemy, jinja2, psycopg"` then `node -e` requiring react, vite, eslint |
| `swe-project` | the shape of issue 13's SWE image: minbase + python3 with a test and science stack and the mini-swe-agent harness (pip, system site-packages) + nodejs with the Claude Code and Codex CLIs (npm, /app) | `python3 -c "import pytest, numpy, pandas, scipy.stats, sympy, django, minisweagent"` |

`build_image(name)` is cached (a stamp beside the layout holds the spec's hash); the tree
and the tar are removed once the layout is written. Needs debootstrap, pigz, npm (host), network
to Debian, PyPI and npm.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rollstack_corpus.spec import DEBIAN_MIRROR, SUITE
from rollstack_corpus.tree import ChrootStep, check_step, remove_tree
from rollstack.errors import InvalidRequest, RuntimeFailure


@dataclass(frozen=True)
class ImageSpec:
    name: str
    apt: tuple[str, ...]
    script: str  # run in a chroot of the tree (network on)
    npm: dict[str, str] | None  # npm project at /app installed with the host's npm
    command: str  # the benchmark's first command
    workdir: str = "/"

    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.name, self.apt, self.script, self.npm, SUITE]).encode()).hexdigest()[:16]


IMAGES: dict[str, ImageSpec] = {
    "python-project": ImageSpec(
        "python-project",
        ("python3", "python3-pip", "python3-venv", "git", "ca-certificates"),
        "pip install --break-system-packages pytest==8.3.4 hypothesis==6.122.3 requests==2.32.3 rich==13.9.4 "
        "pydantic==2.10.4 numpy==2.2.1 attrs==24.3.0\n",
        None,
        "python3 -c 'import pytest, hypothesis, requests, rich, pydantic, numpy'",
    ),
    "node-project": ImageSpec(
        "node-project",
        ("nodejs", "ca-certificates"),
        "",
        {"express": "4.21.2", "lodash": "4.17.21", "typescript": "5.7.2", "jest": "29.7.0"},
        "cd /app && node -e \"require('express'); require('lodash'); require('typescript'); require('jest')\"",
    ),
    "web-project": ImageSpec(
        "web-project",
        ("python3", "python3-pip", "python3-venv", "git", "ca-certificates", "libpq5", "nodejs"),
        "pip install --break-system-packages django==5.1.4 flask==3.1.0 sqlalchemy==2.0.36 jinja2==3.1.5 "
        "gunicorn==23.0.0 psycopg==3.2.3 pytest==8.3.4 requests==2.32.3\n",
        {"react": "18.3.1", "react-dom": "18.3.1", "vite": "6.0.7", "eslint": "9.17.0"},
        "python3 -c 'import django, flask, sqlalchemy, jinja2, psycopg' && cd /app && "
        "node -e \"require('react'); require('react-dom/server'); require('vite'); require('eslint')\"",
    ),
    "swe-project": ImageSpec(
        "swe-project",
        ("python3", "python3-pip", "python3-venv", "git", "ca-certificates", "nodejs"),
        "pip install --break-system-packages pytest==8.3.4 hypothesis==6.122.3 numpy==2.2.1 pandas==2.2.3 "
        "scipy==1.14.1 sympy==1.13.3 django==5.1.4 flask==3.1.0 matplotlib==3.10.0 mini-swe-agent==2.4.6\n",
        {"@anthropic-ai/claude-code": "2.1.332", "@openai/codex": "0.171.0", "typescript": "5.7.2"},
        "python3 -c 'import pytest, numpy, pandas, scipy.stats, sympy, django, minisweagent'",
    ),
}


def default_images_dir() -> Path:
    env = os.environ.get("ROLLSTACK_BENCH_IMAGES")
    if env:
        return Path(env)
    return Path("/var/cache/rollstack/bench-images") if os.geteuid() == 0 else Path.home() / ".cache/rollstack/bench-images"


def image_ref(name: str, root: Path | None = None) -> str:
    return f"oci:{(root or default_images_dir()) / name}:latest"


def build_image(name: str, root: Path | None = None, *, force: bool = False,
                log: Callable[[str], None] = lambda m: None) -> str:
    """Build (or reuse) image `name`; returns its reference `oci:DIR:latest`."""
    if name not in IMAGES:
        raise InvalidRequest(f"unknown bench image {name!r} (one of {', '.join(IMAGES)})")
    spec = IMAGES[name]
    root = root or default_images_dir()
    layout, stamp = root / name, root / f"{name}.stamp"
    if not force and stamp.is_file() and stamp.read_text().strip() == spec.key() and (layout / "index.json").is_file():
        log(f"{name}: cached ({layout})")
        return image_ref(name, root)
    root.mkdir(parents=True, exist_ok=True)
    tree, scratch = root / f"{name}.tree", root / f"{name}.scratch"
    remove_tree(tree)
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        log(f"{name}: debootstrap {SUITE} minbase + {', '.join(spec.apt)}")
        debs = root / "_debs"
        debs.mkdir(exist_ok=True)
        proc = subprocess.run(["debootstrap", "--variant=minbase", f"--cache-dir={debs}",
                               f"--include={','.join(spec.apt)}", SUITE, str(tree), DEBIAN_MIRROR],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise RuntimeFailure(f"debootstrap failed:\n{proc.stdout.decode(errors='replace')[-3000:]}")
        script = spec.script + "apt-get clean\nrm -rf /var/lib/apt/lists/* /root/.cache\ntouch /etc/resolv.conf\n"
        log(f"{name}: project install")
        check_step(ChrootStep([tree], None, script), scratch, f"image {name}")
        if spec.npm:
            app = tree / "app"
            app.mkdir(exist_ok=True)
            (app / "package.json").write_text(json.dumps({"name": name, "version": "1.0.0", "private": True,
                                                          "dependencies": spec.npm}, indent=1))
            proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--registry", "https://registry.npmjs.org/"],
                                  cwd=app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise RuntimeFailure(f"npm install failed:\n{proc.stdout.decode(errors='replace')[-3000:]}")
        log(f"{name}: one gzip layer -> OCI layout")
        write_single_layer_layout(tree, layout, spec)
        stamp.write_text(spec.key())
    finally:
        remove_tree(tree)
        shutil.rmtree(scratch, ignore_errors=True)
    return image_ref(name, root)


def write_single_layer_layout(tree: Path, layout: Path, spec: ImageSpec | None = None) -> dict[str, object]:
    """`tree` as an OCI image layout with one gzip layer (tar --numeric-owner --xattrs | pigz)."""
    shutil.rmtree(layout, ignore_errors=True)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    tmp = layout / "layer.tar.gz.tmp"
    tar = subprocess.Popen(["tar", "-C", str(tree), "--numeric-owner", "--xattrs", "--xattrs-include=*",
                            "--sort=name", "-cf", "-", "."], stdout=subprocess.PIPE)
    diff = hashlib.sha256()
    with open(tmp, "wb") as out:
        gz = subprocess.Popen(["pigz", "-6", "-c"], stdin=subprocess.PIPE, stdout=out)
        assert tar.stdout is not None and gz.stdin is not None
        while True:
            buf = tar.stdout.read(1 << 20)
            if not buf:
                break
            diff.update(buf)
            gz.stdin.write(buf)
        gz.stdin.close()
        if tar.wait() != 0 or gz.wait() != 0:
            raise RuntimeFailure(f"packing {tree} failed (tar {tar.returncode}, pigz {gz.returncode})")
    layer_digest = _sha256_file(tmp)
    layer_size = tmp.stat().st_size
    os.replace(tmp, blobs / layer_digest)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                         "Cmd": ["/bin/sh"], "WorkingDir": spec.workdir if spec else "/"},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff.hexdigest()]}}
    cfg = _put_json(blobs, config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg[0], "size": cfg[1]},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": "sha256:" + layer_digest, "size": layer_size}]}
    man = _put_json(blobs, manifest)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man[0], "size": man[1],
         "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}))
    return {"layer_digest": "sha256:" + layer_digest, "layer_size": layer_size, "manifest": man[0]}


def _put_json(blobs: Path, doc: dict[str, object]) -> tuple[str, int]:
    data = json.dumps(doc, separators=(",", ":")).encode()
    d = hashlib.sha256(data).hexdigest()
    (blobs / d).write_bytes(data)
    return "sha256:" + d, len(data)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def main() -> None:  # python -m rollstack_bench.images [NAME ...]
    import sys

    for name in sys.argv[1:] or list(IMAGES):
        print(build_image(name, log=lambda m: print(f"[images] {m}", file=sys.stderr, flush=True)))


if __name__ == "__main__":
    main()
