"""Parsing /proc/self/mountinfo (mount points with escapes, cgroup hierarchies) and the
classic overlay option string."""

from __future__ import annotations

from pathlib import Path

from rollstack.run.cgroupfs import cgroup_mounts
from rollstack.run.overlay import PINNED_OPTIONS, classic_options, mount_points

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
45 27 0:39 / /tmp/with\\040space/m rw,relatime - overlay rollstack rw,lowerdir+=/a
46 27 0:40 / /tmp/back\\134slash rw - tmpfs tmpfs rw
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
32 25 0:28 / /sys/fs/cgroup/systemd rw,relatime shared:11 - cgroup cgroup rw,name=systemd
"""


def test_mount_points_unescape():
    mps = mount_points(MOUNTINFO)
    assert ("/tmp/with space/m", "overlay") in mps
    assert ("/tmp/back\\slash", "tmpfs") in mps
    assert mps[0] == ("/", "ext4")


def test_cgroup_mounts_include_v1_named_and_v2():
    assert cgroup_mounts(MOUNTINFO) == [("/sys/fs/cgroup/memory", "cgroup"),
                                        ("/sys/fs/cgroup/unified", "cgroup2"),
                                        ("/sys/fs/cgroup/systemd", "cgroup")]


def test_classic_options_order_top_first():
    opts = classic_options([Path("/l/top"), Path("/l/bottom")], Path("/u"), Path("/w"))
    assert opts.startswith("lowerdir=/l/top:/l/bottom,upperdir=/u,workdir=/w,")
    for k, v in PINNED_OPTIONS:
        assert f"{k}={v}" in opts
