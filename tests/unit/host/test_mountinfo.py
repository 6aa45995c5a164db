"""Parsing /proc/self/mountinfo: escapes decoded as bytes then UTF-8, optional fields, cgroups."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollstack.host import mountinfo
from rollstack.host.cgroups import cgroup_mounts, oom_kill_count

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
45 27 0:39 / /tmp/with\\040space/m rw,relatime - overlay rollstack rw,lowerdir+=/a
46 27 0:40 / /tmp/back\\134slash rw - tmpfs tmpfs rw
47 27 0:41 / /tmp/café\\011tab rw shared:3 master:1 - fuse.rollstack rollstack\\040lazy rw,user_id=0
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
32 25 0:28 / /sys/fs/cgroup/systemd rw,relatime shared:11 - cgroup cgroup rw,name=systemd
"""


def test_mount_points_unescape():
    mps = mountinfo.mount_points(MOUNTINFO)
    assert ("/tmp/with space/m", "overlay") in mps
    assert ("/tmp/back\\slash", "tmpfs") in mps
    assert mps[0] == ("/", "ext4")


def test_cgroup_mounts_include_v1_named_and_v2():
    assert cgroup_mounts(MOUNTINFO) == [("/sys/fs/cgroup/memory", "cgroup"),
                                        ("/sys/fs/cgroup/unified", "cgroup2"),
                                        ("/sys/fs/cgroup/systemd", "cgroup")]


def test_non_ascii_paths_survive_and_optional_fields_are_skipped():
    m = mountinfo.parse(MOUNTINFO)[3]
    assert m.mount_point == "/tmp/caf\u00e9\ttab" and m.fstype == "fuse.rollstack"
    assert m.source == "rollstack lazy" and m.options == "rw,rw,user_id=0"


def test_mounted_at_and_mounts_under():
    assert mountinfo.mounted_at("/tmp/with space/m", MOUNTINFO) == "overlay"
    assert mountinfo.mounted_at("/tmp/nothing", MOUNTINFO) is None
    assert mountinfo.mounts_under("/tmp", MOUNTINFO) == ["/tmp/with space/m", "/tmp/back\\slash", "/tmp/caf\u00e9\ttab"]
    assert mountinfo.mounts_under("/tmp/with", MOUNTINFO) == []


def test_the_top_of_stacked_mounts_wins():
    text = "1 0 0:1 / /m rw - tmpfs a rw\n2 1 0:2 / /m rw - overlay b rw\n"
    assert mountinfo.mounted_at("/m", text) == "overlay"


def test_garbage_lines_are_skipped():
    assert mountinfo.parse("nonsense\n\n1 2 3 - x\n") == []


def _escape(path: str) -> str:
    out = []
    for byte in path.encode():
        out.append(f"\\{byte:03o}" if bytes([byte]) in b" \t\n\\" else bytes([byte]).decode("latin-1"))
    return "".join(out).encode("latin-1").decode("utf-8")


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20))
def test_unescape_inverts_the_kernels_escaping(name: str):
    assert mountinfo.unescape(_escape("/" + name)) == "/" + name


def test_oom_kill_count_reads_v1_and_v2_files():
    v1 = "oom_kill_disable 1\nunder_oom 0\noom_kill 3\n"
    v2 = b"low 0\nhigh 4\nmax 2\noom 1\noom_kill 2\n"
    assert oom_kill_count(v1) == 3 and oom_kill_count(v2) == 2 and oom_kill_count("") == 0


def test_is_mounted_finds_only_the_mount_point_field():
    text = MOUNTINFO.encode() + b"50 27 0:42 /tmp/elsewhere /srv/bind rw - ext4 /tmp/source rw,upperdir=/tmp/up\n"
    assert mountinfo.is_mounted("/tmp/with space/m", text)
    assert mountinfo.is_mounted("/tmp/caf\u00e9\ttab", text) and mountinfo.is_mounted("/srv/bind", text)
    for path in ("/tmp/elsewhere", "/tmp/source", "/tmp/up", "/tmp/with", "/tmp/with space", "/srv"):
        assert not mountinfo.is_mounted(path, text), path  # a root, a source, an option, a prefix


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0/"),
                        min_size=1, max_size=12), min_size=1, max_size=6), st.integers(0, 5))
def test_is_mounted_agrees_with_the_full_parse(names: list[str], pick: int):
    """Mount points made of any characters (escaped as the kernel does), one of them probed,
    and the probed name also planted as a root and a source: same answer as `mounted_at`."""
    points = ["/m/" + n for n in names]
    probe = "/m/" + names[pick % len(names)]
    lines = [f"{i + 10} 1 0:{i} /m/{n} {mountinfo.escape(p).decode('utf-8', 'surrogateescape')} rw - tmpfs "
             f"{mountinfo.escape(probe).decode('utf-8', 'surrogateescape')} rw"
             for i, (n, p) in enumerate(zip(names, points))]
    text = "\n".join(lines) + "\n"
    for path in {probe, probe + "x", "/m"}:
        assert mountinfo.is_mounted(path, text.encode("utf-8", "surrogateescape")) == \
            (mountinfo.mounted_at(path, text) is not None), (path, text)


def test_of_types_parses_only_those_lines():
    text = MOUNTINFO + "60 27 0:50 / /tmp/x\\040-\\040cgroup\\040y rw - tmpfs cgroup rw\n"
    got = mountinfo.of_types(("cgroup", "cgroup2"), text)
    assert [m.mount_point for m in got] == ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified",
                                            "/sys/fs/cgroup/systemd"]
    assert got == [m for m in mountinfo.parse(text) if m.fstype in ("cgroup", "cgroup2")]


def test_the_hosts_cgroup_mounts_are_read_once(monkeypatch):
    from rollstack.host import cgroups

    cgroups.forget_mounts()
    reads = []
    monkeypatch.setattr(cgroups, "_of", lambda text: reads.append(text) or [("/sys/fs/cgroup/memory", "cgroup")])
    assert cgroups.cgroup_mounts() == cgroups.cgroup_mounts() == [("/sys/fs/cgroup/memory", "cgroup")]
    assert reads == [None]
    cgroups.forget_mounts()
    cgroups.cgroup_mounts()
    assert reads == [None, None]
    monkeypatch.setattr(cgroups, "_of", lambda text: reads.append(text) or [])
    cgroups.forget_mounts()
    cgroups.cgroup_mounts()
    cgroups.cgroup_mounts()  # none found is not kept
    assert reads == [None, None, None, None]
    cgroups.forget_mounts()


def test_the_oom_counter_is_the_memory_hierarchys(tmp_path, monkeypatch):
    from rollstack.host import cgroups

    for h in ("cpu", "memory", "unified"):
        (tmp_path / h / "rollstack" / "e1").mkdir(parents=True)
    (tmp_path / "memory" / "rollstack" / "e1" / "memory.oom_control").write_text("oom_kill 2\n")
    (tmp_path / "unified" / "rollstack" / "e1" / "cgroup.procs").write_text("")  # hybrid: no memory.events
    monkeypatch.setattr(cgroups, "_HOST_MOUNTS", tuple((str(tmp_path / h), t) for h, t in (
        ("cpu", "cgroup"), ("unified", "cgroup2"), ("memory", "cgroup"))))
    assert cgroups.oom_counter_file("e1") == tmp_path / "memory" / "rollstack" / "e1" / "memory.oom_control"
    assert cgroups.oom_kills("e1") == 2
    assert cgroups.oom_counter_file("e2") is None
    (tmp_path / "unified" / "rollstack" / "e1" / "memory.events").write_text("oom_kill 3\n")  # v2
    assert cgroups.oom_kills("e1") == 3
