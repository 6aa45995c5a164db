"""The containerd baselines end to end on a tiny synthetic corpus (busybox-static trees).

A real docker-registry in a shaped network namespace, a private containerd (overlayfs + runc),
images built from directory trees and pushed with skopeo; cold and warm init of both baselines.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from components import need
from rollstack_bench.systems.baselines import DockerEquivalent, DynamicAssembly, Stack, prepare_images
from rollstack_bench.systems.containerd import PrivateContainerd, available
from rollstack_bench.systems.registry import NetnsRegistry
from rollstack_bench.link.netem import ShapedLink

pytestmark = pytest.mark.integration

BUSYBOX = Path("/bin/busybox")


def _tiny_corpus(root: Path) -> Stack:
    os_tree = root / "os"
    (os_tree / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, os_tree / "bin" / "busybox")
    for applet in ("sh", "cat", "ls", "echo", "test"):
        (os_tree / "bin" / applet).symlink_to("busybox")
    for d in ("proc", "dev", "sys", "tmp", "etc", "work"):
        (os_tree / d).mkdir()
    (os_tree / "etc" / "gone.conf").write_text("deleted by the repo layer\n")
    repo = root / "repo-tiny" / "work" / "tiny"
    repo.mkdir(parents=True)
    (repo / "hello.txt").write_text("hello from the repo layer\n")
    (root / "repo-tiny" / "etc").mkdir()
    # An overlay whiteout (0/0 character device): the repo layer deletes /etc/gone.conf.
    os.mknod(root / "repo-tiny" / "etc" / "gone.conf", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    tool = root / "harness-tool" / "opt" / "tool" / "bin" / "tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho tool-1.0\n")
    tool.chmod(0o755)
    (root / "manifest.json").write_text(json.dumps({"flavor": "test", "built_at": str(os.getpid())}))
    return Stack(root, "repo-tiny", "harness-tool", "/work/tiny", "/opt/tool")


@pytest.fixture
def env(tmp_path_factory: pytest.TempPathFactory):
    why = available()
    need(not why, str(why))
    need(BUSYBOX.exists(), f"busybox-static ({BUSYBOX})")
    # Short base path: containerd's socket path must stay under 108 bytes.
    base = Path(f"/tmp/rsb-ctd-{os.getpid()}")
    base.mkdir()
    corpus = tmp_path_factory.mktemp("corpus")
    stack = _tiny_corpus(corpus)
    try:
        with ShapedLink("dc") as link, NetnsRegistry(link, base / "registry") as reg, \
                PrivateContainerd(base / "ctd") as ctr:
            images = prepare_images([stack], reg.address, base / "images")
            yield stack, link, ctr, images, base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_docker_equivalent_cold_then_warm(env) -> None:
    stack, link, ctr, images, base = env
    system = DockerEquivalent(ctr, link, images, base / "work")
    cmd = ["/bin/sh", "-c", "cat /work/tiny/hello.txt && /opt/tool/bin/tool && test ! -e /etc/gone.conf"]
    cold = system.cold_init(stack, cmd)
    assert cold.exit_code == 0, cold.output
    assert "hello from the repo layer" in cold.output and "tool-1.0" in cold.output
    assert cold.bytes_pulled > 500_000  # busybox alone is ~1 MB compressed... at least half of it crossed the link
    assert "pull" in cold.phases and cold.ready_s <= cold.first_cmd_s
    warm = system.warm_init(stack, cmd)
    assert warm.exit_code == 0, warm.output
    assert "pull" not in warm.phases
    assert warm.bytes_pulled < 50_000  # nothing pulled, only stray packets


def test_dynamic_assembly_unpacks_harness_at_init(env) -> None:
    stack, link, ctr, images, base = env
    system = DynamicAssembly(ctr, link, images, base / "work")
    cmd = ["/bin/sh", "-c", "/opt/tool/bin/tool && cat /work/tiny/hello.txt"]
    cold = system.cold_init(stack, cmd)
    assert cold.exit_code == 0, cold.output
    assert "tool-1.0" in cold.output
    assert {"pull", "harness_fetch", "harness_unpack"} <= set(cold.phases)
    warm = system.warm_init(stack, cmd)
    assert warm.exit_code == 0 and "pull" not in warm.phases
    assert "harness_unpack" in warm.phases  # unpacked again for every environment
    assert not list((base / "work" / "envs").iterdir())  # per-environment trees are removed
