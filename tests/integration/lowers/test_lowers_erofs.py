"""EROFS lowers in a node (lowers/erofs.py, stages' lower choice): with the images published beside
the group (plan/lowers.py) even the first environment stacks EROFS mounts, fetched not built;
without them, after the first environment of a stack later ones stack each layer's EROFS mount
instead of its FUSE directory, and behave the same (commands, files, diff); a GRPO group waits
for the mounts (`erofs_wait`), a lone first create does not; with `lowers.erofs` off nothing is
mounted; a node's stop leaves no mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from components import need
from node_helpers import leftovers, plan, publish_corpus, remember
from rollstack.format import erofs
from rollstack.format.reader import read_files, read_toc
from rollstack.node.config import NodeConfig
from rollstack.lowers.erofs import build_image, supported
from rollstack.contract.models import ExecRequest
from rollstack.node.service import NodeService
from rollstack.store.source import StoreBlobSource
from rollstack.store.spec import open_store

pytestmark = pytest.mark.integration
SMALL = {"cpu": 0.1, "memory": "64Mi", "max_cpu": 1, "max_memory": "256Mi"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("erofs-corpus")
    return publish_corpus(work / "store", work / "build")


def _node(corpus: str, root: Path, **kw) -> NodeService:
    service = NodeService(NodeConfig(root=root, store=corpus, warm_pool=0, max_environments=8,
                                     lowers={"materialize_after": 0, **kw}))
    service.start()
    return service


def _lowers(service: NodeService, env_id: str) -> list[str]:
    """The layer dirs the environment stacks (before any idmapped clone of them)."""
    return [str(p) for p in service._get(env_id).runtime.lowers]


def _exercise(service: NodeService, env_id: str) -> None:
    r = service.exec(env_id, ExecRequest(command="cat hello.txt && ls /bin | grep -c . && echo new > made.txt"))
    assert r.exit_code == 0, r
    lines = r.stdout.split()
    assert lines[0] == "bug" or lines[0], r.stdout  # the task's mutated file, read through the lowers
    assert int(lines[-1]) > 10  # busybox's applets: a directory listing of the os layer
    assert "made.txt" in service.diff(env_id)


def test_published_images_put_the_first_environment_on_erofs(corpus: str, tmp_path: Path) -> None:
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    root = tmp_path / "root"
    service = _node(corpus, root)
    try:
        stack = service.stages.resolver.resolve(plan(resources=SMALL))
        assert stack.layers and all(layer.erofs for layer in stack.layers)  # publish made them
        first = service.create(plan(resources=SMALL))  # alone and first: waits for a fetch only
        remember(root, first.id)
        lowers = _lowers(service, first.id)
        assert lowers and all(str(root / "erofs") in p for p in lowers), lowers
        stats = service.stages.lowers.erofs.stats()
        assert stats["fetched"] == len(stack.layers) and stats["failed"] == 0, stats
        store = open_store(corpus)
        for layer in stack.layers:  # what was fetched: this node's own build plus the small files
            source = StoreBlobSource(store, layer.repo, layer.digest, layer.size)
            toc = read_toc(source).toc
            inline = read_files(source, toc, erofs.inline_candidates(toc))
            assert inline  # every corpus layer has small files (/etc/passwd in the os layer)
            hexd = layer.digest.partition(":")[2]
            fetched = (root / "erofs" / f"{hexd}.img").read_bytes()
            assert fetched == erofs.build(toc, layer.digest, inline)[0]
            assert fetched != build_image(root / "lazy" / "state" / "tocs", layer.digest)
        _exercise(service, first.id)
        service.destroy(first.id)
    finally:
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def test_later_environments_stack_erofs_mounts(corpus: str, tmp_path: Path) -> None:
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    root = tmp_path / "root"
    service = _node(corpus, root, erofs_published=False)
    try:
        first = service.create(plan(resources=SMALL))
        remember(root, first.id)
        assert all("lazy/mnt" in p for p in _lowers(service, first.id))
        assert service.stages.lowers.erofs.wait_idle(60)
        assert service.stages.lowers.erofs.failures() == {}
        second = service.create(plan(resources=SMALL))
        remember(root, second.id)
        lowers = _lowers(service, second.id)
        assert lowers and all(str(root / "erofs") in p for p in lowers), lowers
        _exercise(service, second.id)
        _exercise(service, first.id)  # the first keeps its FUSE lowers and works as before
        service.destroy(first.id)
        service.destroy(second.id)
    finally:
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)


def test_a_group_waits_for_the_mounts_and_a_lone_first_create_does_not(corpus: str, tmp_path: Path) -> None:
    need(supported(), "Linux >= 6.12 with EROFS (file-backed mounts)")
    root = tmp_path / "root"
    service = _node(corpus, root, erofs_wait=60, erofs_published=False)
    try:
        group = service.create_many(plan(resources=SMALL), 2)  # the stack's first create: a group
        for env in group:
            remember(root, env.id)
            lowers = _lowers(service, env.id)
            assert all(str(root / "erofs") in p for p in lowers), lowers
        _exercise(service, group[0].id)
        for env in group:
            service.destroy(env.id)
    finally:
        service.stop()
    assert not any(leftovers(root).values()), leftovers(root)
    root2 = tmp_path / "root2"
    service = _node(corpus, root2, erofs_wait=60, erofs_published=False)
    try:
        env = service.create(plan(resources=SMALL))  # alone and first: never waits
        remember(root2, env.id)
        assert all("lazy/mnt" in p for p in _lowers(service, env.id))
        service.destroy(env.id)
    finally:
        service.stop()


def test_erofs_lowers_off_keeps_fuse(corpus: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    service = _node(corpus, root, erofs=False)
    try:
        assert service.stages.lowers.erofs is None
        for _ in range(2):
            env = service.create(plan(resources=SMALL))
            remember(root, env.id)
            assert all("lazy/mnt" in p for p in _lowers(service, env.id))
            service.destroy(env.id)
    finally:
        service.stop()
    assert not (root / "erofs").exists()
