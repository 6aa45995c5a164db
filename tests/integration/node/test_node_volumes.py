"""Volumes (docs/node.md#volumes), as root on real runc and overlayfs: a named directory of the
node outlives the environments that mount it, read-only mounts cannot write, the files API sees
what the environment's processes see, exclusive mounts and deletes of mounted volumes answer
`volume_busy`, and no teardown (user-namespaced or not) ever removes a volume's files."""

from __future__ import annotations

import pytest

from node_helpers import leftovers, plan, remember, serve_node
from rollstack import Client, errors

pytestmark = pytest.mark.integration
TOKEN = "volumes-token"


@pytest.fixture(scope="module")
def node(corpus: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("volumes-root")
    with serve_node(root, corpus, TOKEN, max_environments=8, warm_pool=0) as (service, server):
        with Client(server.url, token=TOKEN, lease=None) as client:
            yield root, service, client


def _sh(env, script: str) -> tuple[int, str, str]:
    r = env.exec(["/bin/sh", "-c", script], timeout=60)
    return r.exit_code, r.stdout, r.stderr


def _create(root, client, **overrides):
    env = client.create(plan(**overrides))
    remember(root, env.id)
    return env


@pytest.mark.parametrize("userns", [False, True])
def test_a_volume_outlives_its_environments_and_read_only_mounts_cannot_write(node, userns: bool) -> None:
    root, service, client = node
    name = f"data-{int(userns)}"
    client.create_volume(name)
    client.write_volume_file(name, "/seed/input.txt", b"from the API\n")
    try:
        writer = _create(root, client, security={"userns": userns},
                         volumes=[{"name": name, "path": "/mnt/data"}])
        assert _sh(writer, "cat /mnt/data/seed/input.txt") == (0, "from the API\n", "")
        code, _, err = _sh(writer, "echo written-inside > /mnt/data/out.txt && id -u && stat -c %u /mnt/data/out.txt")
        assert code == 0, err
        assert client.read_volume_file(name, "/out.txt") == b"written-inside\n"
        assert (root / "volumes" / name / "data" / "out.txt").stat().st_uid == 0  # stored as root's
        writer.destroy()
        assert client.read_volume_file(name, "/out.txt") == b"written-inside\n"  # outlived it

        reader = _create(root, client, security={"userns": userns},
                         volumes=[{"name": name, "path": "/mnt/data", "read_only": True}])
        assert _sh(reader, "cat /mnt/data/out.txt")[1] == "written-inside\n"
        code, _, err = _sh(reader, "echo no > /mnt/data/denied.txt")
        assert code != 0 and "Read-only" in err
        # the files API follows the mount the processes see, and keeps it read-only
        assert reader.read_file("/mnt/data/seed/input.txt") == b"from the API\n"
        with pytest.raises(errors.InvalidRequest, match="read-only"):
            reader.write_file("/mnt/data/denied.txt", b"no")
        assert service.wait_destroyed(60)  # the writer's teardown (asynchronous) holds its mount until it ends
        [listed] = [v for v in client.volumes() if v.name == name]
        assert listed.mounted_by == [reader.id]
        with pytest.raises(errors.VolumeBusy, match=reader.id):
            client.delete_volume(name)
        reader.destroy()
    finally:
        for env in client.list():
            client.destroy(env.id)
    assert (root / "volumes" / name / "data" / "out.txt").read_bytes() == b"written-inside\n"
    client.delete_volume(name)
    assert name not in [v.name for v in client.volumes()]
    assert not (root / "volumes" / name).exists()
    assert leftovers(root)["mounts"] == [] and leftovers(root)["envs"] == []


def test_the_files_api_writes_into_a_read_write_volume(node) -> None:
    root, _service, client = node
    client.create_volume("ws")
    try:
        env = _create(root, client, volumes=[{"name": "ws", "path": "/work/app/ws"}])
        env.write_file("/work/app/ws/sub/result.json", b'{"ok": true}')
        assert client.read_volume_file("ws", "/sub/result.json") == b'{"ok": true}'
        assert _sh(env, "cat ws/sub/result.json")[1] == '{"ok": true}'
        env.write_file("/work/app/own.txt", b"mine")  # outside the mount: the environment's own
        with pytest.raises(errors.NotFound):
            client.read_volume_file("ws", "/own.txt")
        env.destroy()
    finally:
        client.delete_volume("ws")


def test_exclusive_mounts_and_unknown_or_hostile_volumes_are_refused(node) -> None:
    root, _service, client = node
    client.create_volume("solo")
    try:
        with pytest.raises(errors.AlreadyExists):
            client.create_volume("solo")
        owner = _create(root, client, volumes=[{"name": "solo", "path": "/data", "exclusive": True}])
        with pytest.raises(errors.VolumeBusy, match=owner.id):
            _create(root, client, volumes=[{"name": "solo", "path": "/data", "read_only": True}])
        owner.destroy()
        a = _create(root, client, volumes=[{"name": "solo", "path": "/data"}])
        with pytest.raises(errors.VolumeBusy):  # an exclusive mount while another holds it
            _create(root, client, volumes=[{"name": "solo", "path": "/data", "exclusive": True}])
        b = _create(root, client, volumes=[{"name": "solo", "path": "/data"}])  # shared: fine
        _sh(a, "echo from-a > /data/shared.txt")
        assert _sh(b, "cat /data/shared.txt")[1] == "from-a\n"
        a.destroy()
        b.destroy()
        with pytest.raises(errors.VolumeNotFound):
            _create(root, client, volumes=[{"name": "missing", "path": "/data"}])
        for bad in ("..", "a/b", "-x", "x" * 64):
            with pytest.raises(errors.InvalidRequest):
                client.create_volume(bad)
        with pytest.raises(errors.PlanInvalid):
            _create(root, client, volumes=[{"name": "solo", "path": "/proc/x"}])
        with pytest.raises(errors.UnsafePath):
            client.write_volume_file("solo", "/../escape.txt", b"x")
        with pytest.raises(errors.VolumeNotFound):
            client.read_volume_file("nope", "/x")
    finally:
        for env in client.list():
            client.destroy(env.id)
        client.delete_volume("solo")
    assert not (root / "escape.txt").exists() and not (root / "volumes" / "escape.txt").exists()
    assert leftovers(root)["mounts"] == []


def test_forks_and_snapshots_mount_the_parents_volumes_without_copying_them(node) -> None:
    root, _service, client = node
    client.create_volume("shared")
    try:
        parent = _create(root, client, volumes=[{"name": "shared", "path": "/data"}])
        _sh(parent, "echo from-parent > /data/p.txt && echo in-upper > /work/app/u.txt")
        kids = parent.fork(2)
        for k in kids:
            remember(root, k.id)
        _sh(kids[0], "echo from-child > /data/c.txt")
        assert _sh(kids[1], "cat /data/p.txt /data/c.txt /work/app/u.txt")[1] == "from-parent\nfrom-child\nin-upper\n"
        assert _sh(parent, "cat /data/c.txt")[1] == "from-child\n"  # one volume, not a copy
        snap = parent.snapshot("vol/snap:1")
        try:
            again = client.create(snap.plan)
            remember(root, again.id)
            assert _sh(again, "cat /data/c.txt /work/app/u.txt")[1] == "from-child\nin-upper\n"
        finally:
            for env in client.list():
                client.destroy(env.id)
            client.delete_snapshot("vol/snap:1")
    finally:
        client.delete_volume("shared")
