"""Fixtures for the format tests: build tar archives member by member, convert them in memory."""

from __future__ import annotations

import tarfile
from typing import Callable

import pytest

from format_tar_helpers import layer_bytes, tar_bytes, ti


@pytest.fixture
def make_ti() -> Callable[..., tarfile.TarInfo]:
    return ti


@pytest.fixture
def make_tar() -> Callable[..., bytes]:
    return tar_bytes


@pytest.fixture
def make_layer() -> Callable[..., bytes]:
    return layer_bytes
