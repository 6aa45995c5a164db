"""rollstack.run.userns.shift_upper: what the node wrote as host root gets the mapped range's
owners; entries already in the range stay; changes go through `via` when given (root only:
chown)."""

from __future__ import annotations

import os

import pytest

from rollstack.run.userns import HOST_BASE, shift_upper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


def _tree(top):
    (top / "d" / "e").mkdir(parents=True)
    (top / "d" / "e" / "f").write_text("x")
    (top / "suid").write_text("s")
    os.chmod(top / "suid", 0o4755)
    os.symlink("d/e/f", top / "link")
    (top / "inrange").write_text("k")
    os.lchown(top / "inrange", HOST_BASE + 5, HOST_BASE + 6)
    os.lchown(top / "d", 1000, HOST_BASE + 7)  # uid outside, gid inside


def test_shift_upper_in_place(tmp_path):
    _tree(tmp_path)
    assert shift_upper(tmp_path) == 5  # d, d/e, d/e/f, suid, link; inrange kept
    owners = {p.relative_to(tmp_path).as_posix(): (p.lstat().st_uid, p.lstat().st_gid) for p in tmp_path.rglob("*")}
    assert owners == {"d": (HOST_BASE + 1000, HOST_BASE + 7), "d/e": (HOST_BASE, HOST_BASE),
                      "d/e/f": (HOST_BASE, HOST_BASE), "suid": (HOST_BASE, HOST_BASE),
                      "link": (HOST_BASE, HOST_BASE), "inrange": (HOST_BASE + 5, HOST_BASE + 6)}
    assert (tmp_path / "suid").stat().st_mode & 0o7777 == 0o4755  # chown's setuid clear undone
    assert shift_upper(tmp_path) == 0  # idempotent


def test_shift_upper_changes_through_via(tmp_path):
    upper, via = tmp_path / "upper", tmp_path / "via"
    for top in (upper, via):
        top.mkdir()
        _tree(top)
    assert shift_upper(upper, via=via) == 5
    assert (upper / "d" / "e" / "f").stat().st_uid == 0  # read in the upper, written through via
    assert (via / "d" / "e" / "f").stat().st_uid == HOST_BASE
    assert (via / "d").stat().st_uid == HOST_BASE + 1000
