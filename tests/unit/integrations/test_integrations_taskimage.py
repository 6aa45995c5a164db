"""The pure parts of the Harbor provider: what defines a task's image (its cache key), the group
it becomes, the plan over it, and the tar transfer's refusal of hostile archives."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest
from rollstack.integrations.taskimage import TaskImage, config_of, group_name, image_key, image_ref
from rollstack.integrations.transfer import pack_dir, unpack_into


def _context(root: Path, dockerfile: str = "FROM x\n", **files: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_image_refs_take_a_transport() -> None:
    assert image_ref("python:3.12") == "docker://python:3.12"
    assert image_ref("oci:/images/base:t") == "oci:/images/base:t"
    assert image_ref(" docker://ghcr.io/a/b:1 ") == "docker://ghcr.io/a/b:1"
    for bad in ("", "a b", "x\ny"):
        with pytest.raises(InvalidRequest):
            image_ref(bad)


def test_the_key_follows_what_defines_the_image(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "env", data="1")
    key, source = image_key(ctx, None)
    assert source == "Dockerfile"
    assert image_key(ctx, None)[0] == key  # stable
    (ctx / "data").touch()  # a new mtime alone changes nothing
    assert image_key(ctx, None)[0] == key
    (ctx / "data").write_text("2")
    assert image_key(ctx, None)[0] != key  # the context's bytes do
    (ctx / "data").write_text("1")
    (ctx / "data").chmod(0o755)
    assert image_key(ctx, None)[0] != key  # and its modes
    prebuilt, ref = image_key(ctx, "debian:12")
    assert ref == "docker://debian:12" and prebuilt != key  # a docker_image wins over the Dockerfile
    assert image_key(tmp_path / "nothing", "debian:12")[0] == prebuilt
    with pytest.raises(InvalidRequest):
        image_key(tmp_path / "nothing", None)


def test_group_names_are_repository_safe() -> None:
    key = "ab" * 32
    assert group_name("Hello World/../x", key) == f"harbor/hello-world-x:k{key[:20]}"
    assert group_name("___", key).startswith("harbor/task:")


def test_the_plan_takes_the_image_config_and_the_task_wins() -> None:
    env, workdir, user = config_of({"config": {"Env": ["PATH=/bin", "A=1=2", "junk"], "WorkingDir": "/app",
                                               "User": "agent"}})
    assert (env, workdir, user) == ({"PATH": "/bin", "A": "1=2"}, "/app", "agent")
    assert config_of({}) == ({}, "/", "")
    image = TaskImage("harbor/t:k1", env=env, workdir=workdir)
    plan = image.plan("t", workdir=None, env={"A": "task"}, cpus=1, memory_mb=512, network="none")
    assert plan["groups"] == ["harbor/t:k1"] and plan["workdir"] == "/app" and plan["network"] == "none"
    assert plan["env"] == {"PATH": "/bin", "A": "task"}
    assert plan["resources"] == {"cpu": 1.0, "memory": "512Mi"}
    assert image.plan("t", workdir="/w")["workdir"] == "/w" and "resources" not in image.plan("t")
    from rollstack.plan.model import load_plan

    load_plan(plan)  # a valid plan


def test_a_directory_round_trips_and_hostile_tars_write_nothing_outside(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "run.sh").chmod(0o755)
    (src / "a.txt").write_text("a")
    out = tmp_path / "out"
    unpack_into(pack_dir(src), out)
    assert (out / "a.txt").read_text() == "a" and (out / "sub" / "run.sh").stat().st_mode & 0o777 == 0o755
    for name, kind in (("../escape", tarfile.REGTYPE), ("link", tarfile.SYMTYPE)):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            tar.addfile(info, io.BytesIO(b""))
        target = tmp_path / f"hostile-{kind!r}"
        with pytest.raises(tarfile.FilterError):
            unpack_into(buf.getvalue(), target)
    assert not (tmp_path / "escape").exists()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # a device and a pipe left in a log dir
        for name, kind in (("dev", tarfile.CHRTYPE), ("pipe", tarfile.FIFOTYPE), ("log.txt", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            tar.addfile(info, io.BytesIO(b""))
    unpack_into(buf.getvalue(), tmp_path / "logs")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["log.txt"]  # the rest is kept
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("/abs-from-env"), io.BytesIO(b""))
    unpack_into(buf.getvalue(), tmp_path / "abs")  # an absolute name lands inside the target
    assert (tmp_path / "abs" / "abs-from-env").exists() and not Path("/abs-from-env").exists()
