"""The error tree: every code documented in errors.py's tree with its status and whether it is
retryable, and the wire form round-trips (also for a code this client does not know)."""

from __future__ import annotations

import re

import pytest

import rollstack.errors as errors
from rollstack.errors import RollstackError, _all_classes, error_class, from_dict


def _ours() -> list[type[RollstackError]]:
    """The product's classes (not a test module's local subclasses)."""
    return [c for c in _all_classes() if c.__module__.startswith("rollstack.")]


def _tree() -> dict[str, tuple[int, bool]]:
    out = {}
    for line in (errors.__doc__ or "").splitlines():
        m = re.search(r"(\w+)\s+([a-z_]+)\s+(\d{3})(.*)$", line)
        if m and m.group(1)[0].isupper():
            out[m.group(2)] = (int(m.group(3)), "(R" in m.group(4))
    return out


@pytest.mark.parametrize("cls", [c for c in _ours() if c is not RollstackError], ids=lambda c: c.code)
def test_every_code_is_documented_with_its_status_and_retryability(cls: type[RollstackError]) -> None:
    tree = _tree()
    assert cls.code in tree, f"{cls.__name__} ({cls.code}) is missing from the tree in errors.py"
    assert tree[cls.code] == (cls.status, cls.retryable), cls.__name__


@pytest.mark.parametrize("cls", _ours(), ids=lambda c: c.code)
def test_the_wire_form_round_trips(cls: type[RollstackError]) -> None:
    body = cls("boom", where="x").to_dict()
    assert body["retryable"] is cls.retryable
    err = from_dict(body)
    # a subclass that keeps its parent's code (plan.refs.InvalidReference) comes back as the parent
    assert type(err) is error_class(cls.code) and issubclass(cls, type(err))
    assert err.code == cls.code and err.retryable is cls.retryable
    assert err.details == {"where": "x"} and str(err) == "boom"


def test_an_unknown_code_keeps_its_code_and_retryability() -> None:
    err = from_dict({"code": "brand_new", "message": "m", "retryable": True})
    assert type(err) is RollstackError and err.code == "brand_new" and err.retryable
