"""Regression of the API fuzz: request paths no Linux file can have are the client's error
(InvalidRequest, 400), not an OSError from deep inside a file operation (a 500)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstack.errors import InvalidRequest, UnsafePath
from rollstack.contract.files import NAME_MAX, PATH_MAX, split_request
from rollstack.run.files import SafeRoot


@pytest.mark.parametrize("path", [
    "x" * (NAME_MAX + 1),                  # found: GET /files?path=<a 300-byte zalgo name> -> 500 ENAMETOOLONG
    "/work/" + "é" * 128,                  # 256 bytes in UTF-8, 128 characters
    "a/" * (PATH_MAX // 2 + 1),            # every name short, the path too long
    "/tmp/\ud800",                         # a lone surrogate (a JSON "\ud800" escape): not encodable
])
def test_impossible_names_are_refused_before_any_syscall(tmp_path: Path, path: str) -> None:
    with pytest.raises(InvalidRequest):
        split_request(path)
    root = SafeRoot(tmp_path)
    with pytest.raises(InvalidRequest):
        root.read_file(path)
    with pytest.raises(InvalidRequest):
        root.write_file(path, b"x")
    assert list(tmp_path.iterdir()) == []


def test_the_longest_possible_name_still_works(tmp_path: Path) -> None:
    name = "n" * NAME_MAX
    SafeRoot(tmp_path).write_file(f"/d/{name}", b"ok")
    assert SafeRoot(tmp_path).read_file(f"d/{name}") == b"ok"
    with pytest.raises(UnsafePath):
        split_request("/a/../b")
