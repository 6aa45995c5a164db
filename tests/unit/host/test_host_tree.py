"""`remove_tree`: a tree deeper than shutil.rmtree's recursion goes too (rm -rf), a plain one
by rmtree, a missing one is no error."""

from __future__ import annotations

import os
from rollstack.host.tree import remove_tree


def _deep(root, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)


def test_a_tree_deeper_than_rmtree_goes(tmp_path):
    root = tmp_path / "deep"
    root.mkdir()
    _deep(root, 3000)  # deeper than Python 3.11's rmtree recursion goes
    remove_tree(root)
    assert not root.exists()


def test_plain_and_missing(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    remove_tree(tmp_path / "a")
    remove_tree(tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []
