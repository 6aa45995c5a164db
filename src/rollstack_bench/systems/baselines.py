"""The baselines rollstack is measured against, on the same corpus, registry and link.

- `docker-equivalent` (`DockerEquivalent`): containerd + overlayfs snapshotter + runc, the
  engine under Docker. One image per repository x harness (harness statically bundled: layers
  os, repo, harness). Init = `ctr images pull` (+ unpack) -> `ctr containers create` (ready) ->
  `ctr tasks start` running the first command.
- `dynamic-assembly` (`DynamicAssembly`): containerd with the repository image (os, repo); the
  harness is a separate artifact fetched from the same registry and unpacked at init, then
  bind-mounted at its prefix.

Both offer `cold_init(stack, cmd)` (every cache cleared, page cache dropped) and
`warm_init(stack, cmd)` (images and harness tarballs kept) returning an `InitTiming`: seconds
from request to ready and to first command done, and bytes pulled over the link (the veth's
receive counter, so HTTP overhead counts too). `prepare_images()` builds and pushes the images.
"""

from __future__ import annotations

import itertools
import json
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import httpx

from rollstack_bench.systems import oci
from rollstack_bench.systems.containerd import Ctr, drop_page_cache
from rollstack_bench.link.netem import ShapedLink
from rollstack.errors import InvalidRequest, RuntimeFailure

IMAGE_PREFIX = "bench"


@dataclass(frozen=True)
class Stack:
    """One environment's content: corpus components, bottom first (os, repo-X, harness-Y)."""

    corpus: Path
    repo: str  # component name, e.g. "repo-more-itertools"
    harness: str  # component name, e.g. "harness-mini-swe-agent"
    workdir: str = "/"
    harness_prefix: str = ""

    @property
    def name(self) -> str:
        return f"{self.repo.removeprefix('repo-')}--{self.harness.removeprefix('harness-')}"

    @property
    def components(self) -> list[str]:
        return ["os", self.repo, self.harness]


def stacks_from_corpus(corpus: Path) -> list[Stack]:
    """Every repository x harness stack of a built corpus."""
    from rollstack_corpus.build import load_corpus

    manifest, _ = load_corpus(corpus)
    repos = [c for c in manifest.components if c.kind == "repo"]
    harnesses = [c for c in manifest.components if c.kind == "harness"]
    return [Stack(corpus, r.name, h.name, str(r.info.get("workdir", "/")), str(h.info.get("prefix", "")))
            for r in repos for h in harnesses]


@dataclass
class InitTiming:
    """One environment creation as measured by a baseline."""

    system: str
    stack: str
    cold: bool
    ready_s: float  # request -> environment ready to run commands
    first_cmd_s: float  # request -> first command completed
    bytes_pulled: int  # received over the link during this init
    exit_code: int
    phases: dict[str, float] = field(default_factory=dict)
    output: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PushedImages:
    """Image references in the registry for one stack."""

    bundled: str  # os + repo + harness (docker-equivalent)
    repo_only: str  # os + repo (dynamic-assembly)
    harness_repo: str  # registry repository holding the harness blob
    harness_blob: oci.LayerBlob


def _layer_key(corpus: Path, component: str) -> str:
    mf = json.loads((corpus / "manifest.json").read_text())
    return f"{mf.get('flavor', 'x')}-{component}-{mf.get('built_at', '').replace(':', '')}"


def prepare_images(stacks: Sequence[Stack], registry: str, cache: Path) -> dict[str, PushedImages]:
    """Build (cached) gzip layers for each component, write images, push them to `registry`."""
    layout = cache / "oci-layout"
    blobs_dir = cache / "layers"
    layers: dict[tuple[Path, str], oci.LayerBlob] = {}
    out: dict[str, PushedImages] = {}
    for st in stacks:
        for comp in st.components:
            key = (st.corpus, comp)
            if key not in layers:
                layers[key] = oci.build_layer(st.corpus / comp, blobs_dir, _layer_key(st.corpus, comp), cache / "layer-meta")
                oci.link_blob(layout, layers[key])
        os_l, repo_l, h_l = (layers[(st.corpus, c)] for c in st.components)
        tags = {
            "bundled": (f"{IMAGE_PREFIX}/{st.name}", [os_l, repo_l, h_l]),
            "repo_only": (f"{IMAGE_PREFIX}/{st.repo}", [os_l, repo_l]),
            "harness": (f"{IMAGE_PREFIX}/{st.harness}", [h_l]),
        }
        refs = {}
        for kind, (repo, ls) in tags.items():
            tag = f"{st.name}-{kind}" if kind == "bundled" else "latest"
            oci.write_image(layout, tag, ls, workdir=st.workdir)
            oci.push(layout, tag, registry, repo)
            refs[kind] = f"{registry}/{repo}:{tag}"
        out[st.name] = PushedImages(refs["bundled"], refs["repo_only"], f"{IMAGE_PREFIX}/{st.harness}", h_l)
    return out


class _System:
    name = "baseline"
    _ids = itertools.count()

    def __init__(self, ctr: Ctr, link: ShapedLink, images: dict[str, PushedImages], work: Path) -> None:
        self.ctr, self.link, self.images, self.work = ctr, link, images, work

    def _pushed(self, stack: Stack) -> PushedImages:
        try:
            return self.images[stack.name]
        except KeyError:
            raise InvalidRequest(f"no images prepared for stack {stack.name}") from None

    def clear(self) -> None:
        """Forget everything this system cached (cold start), then drop the page cache."""
        self.ctr.clear()
        drop_page_cache()

    def cold_init(self, stack: Stack, cmd: Sequence[str]) -> InitTiming:
        self.clear()
        return self._init(stack, cmd, cold=True)

    def warm_init(self, stack: Stack, cmd: Sequence[str]) -> InitTiming:
        return self._init(stack, cmd, cold=False)

    def _init(self, stack: Stack, cmd: Sequence[str], cold: bool) -> InitTiming:
        raise NotImplementedError

    def _run(self, ref: str, cmd: Sequence[str], t0: float, phases: dict[str, float],
             mounts: Sequence[tuple[str, str]] = ()) -> tuple[float, float, subprocess.CompletedProcess[str]]:
        cid = f"rsb-{int(time.time())}-{next(self._ids)}"
        try:
            t = time.perf_counter()
            self.ctr.create(ref, cid, cmd, mounts)
            phases["create"] = time.perf_counter() - t
            ready = time.perf_counter() - t0
            t = time.perf_counter()
            proc = self.ctr.start(cid)
            phases["first_cmd"] = time.perf_counter() - t
            return ready, time.perf_counter() - t0, proc
        finally:
            self.ctr.delete(cid)


class DockerEquivalent(_System):
    """containerd + overlayfs + runc, harness bundled into the image."""

    name = "docker-equivalent"

    def _init(self, stack: Stack, cmd: Sequence[str], cold: bool) -> InitTiming:
        ref = self._pushed(stack).bundled
        rx0 = self.link.rx_bytes()
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        if not self.ctr.has_image(ref):
            self.ctr.pull(ref)
            phases["pull"] = time.perf_counter() - t0
        ready, done, proc = self._run(ref, cmd, t0, phases)
        return InitTiming(self.name, stack.name, cold, ready, done, self.link.rx_bytes() - rx0, proc.returncode,
                          phases, (proc.stdout + proc.stderr)[-2000:])


class DynamicAssembly(_System):
    """containerd with the repository image; the harness fetched and unpacked at init."""

    name = "dynamic-assembly"

    def clear(self) -> None:
        shutil.rmtree(self.work / "harness-cache", ignore_errors=True)
        super().clear()

    def _init(self, stack: Stack, cmd: Sequence[str], cold: bool) -> InitTiming:
        pushed = self._pushed(stack)
        if not stack.harness_prefix:
            raise InvalidRequest(f"stack {stack.name}: harness prefix unknown")
        rx0 = self.link.rx_bytes()
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        if not self.ctr.has_image(pushed.repo_only):
            self.ctr.pull(pushed.repo_only)
            phases["pull"] = time.perf_counter() - t0
        t = time.perf_counter()
        tarball = self._fetch_harness(pushed)
        phases["harness_fetch"] = time.perf_counter() - t
        t = time.perf_counter()
        env_dir = self.work / "envs" / f"{stack.name}-{next(self._ids)}"
        try:
            _unpack(tarball, env_dir)
            phases["harness_unpack"] = time.perf_counter() - t
            src = env_dir / stack.harness_prefix.lstrip("/")
            ready, done, proc = self._run(pushed.repo_only, cmd, t0, phases, [(str(src), stack.harness_prefix)])
        finally:
            shutil.rmtree(env_dir, ignore_errors=True)
        return InitTiming(self.name, stack.name, cold, ready, done, self.link.rx_bytes() - rx0, proc.returncode,
                          phases, (proc.stdout + proc.stderr)[-2000:])

    def _fetch_harness(self, pushed: PushedImages) -> Path:
        cache = self.work / "harness-cache"
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / pushed.harness_blob.digest.split(":", 1)[1]
        if path.exists():
            return path
        registry = pushed.bundled.split("/", 1)[0]
        url = f"http://{registry}/v2/{pushed.harness_repo}/blobs/{pushed.harness_blob.digest}"
        tmp = path.with_suffix(".part")
        with httpx.stream("GET", url, timeout=300, follow_redirects=True) as resp:
            if resp.status_code != 200:
                raise RuntimeFailure(f"GET {url}: HTTP {resp.status_code}")
            with open(tmp, "wb") as f:
                for chunk in resp.iter_bytes(1 << 20):
                    f.write(chunk)
        tmp.rename(path)
        return path


def _unpack(tarball: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    gz = "pigz" if shutil.which("pigz") else "gzip"
    proc = subprocess.run(f"{gz} -dc {shlex.quote(str(tarball))} | tar -x -C {shlex.quote(str(dest))} --numeric-owner", shell=True,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeFailure(f"unpacking harness failed: {proc.stderr[-1000:]}")


SYSTEMS = {DockerEquivalent.name: DockerEquivalent, DynamicAssembly.name: DynamicAssembly}


def make_system(name: str, ctr: Ctr, link: ShapedLink, images: dict[str, PushedImages], work: Path) -> _System:
    try:
        return SYSTEMS[name](ctr, link, images, work)
    except KeyError:
        raise InvalidRequest(f"unknown baseline {name!r} (one of {', '.join(SYSTEMS)})") from None
