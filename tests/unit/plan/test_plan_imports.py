"""Choosing an image index's manifest (pure logic of plan/imports.py)."""

from __future__ import annotations

import pytest

from rollstack.errors import SourceInvalid
from rollstack.plan.imports import _pick_platform


def _entry(digest: str, arch: str, os_: str = "linux") -> dict[str, object]:
    return {"digest": digest, "platform": {"os": os_, "architecture": arch}}


def test_the_linux_amd64_manifest_is_chosen_else_the_first() -> None:
    index = {"manifests": [_entry("sha256:arm", "arm64"), _entry("sha256:amd", "amd64")]}
    assert _pick_platform(index, "img") == "sha256:amd"
    assert _pick_platform({"manifests": [_entry("sha256:arm", "arm64")]}, "img") == "sha256:arm"


@pytest.mark.parametrize("index", [{"manifests": []}, {}, {"manifests": "x"}, {"manifests": [1]},
                                   {"manifests": [{"platform": {"os": "linux", "architecture": "amd64"}}]},
                                   {"manifests": [{"digest": 7}]}])
def test_a_malformed_index_is_a_typed_error(index: dict[str, object]) -> None:
    with pytest.raises(SourceInvalid):
        _pick_platform(index, "img")
