"""The pools' one placement-try decision (cluster.pool._Attempt), shared by `Pool` and
`AsyncPool`: a full node is skipped, an unreachable one marked dead and skipped, any other error
propagates, and the reservation is always released."""

from __future__ import annotations

import pytest

from rollstack.cluster.pool import _Attempt
from rollstack.errors import InsufficientCapacity, InvalidRequest, NodeLost, NodeUnavailable


class Directory:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def reserve(self, node_id: str, req: object) -> None:
        self.calls.append(("reserve", node_id))

    def release(self, node_id: str, req: object, created: bool) -> None:
        self.calls.append(("release", node_id, created))

    def mark_dead(self, node_id: str) -> None:
        self.calls.append(("dead", node_id))


class Core:
    """Places on the first of `nodes` not excluded (like `place()`, which raises when none is left)."""

    def __init__(self, *nodes: str) -> None:
        self.nodes, self.directory, self.records = nodes, Directory(), []

    def choose(self, req: object, exclude: set[str]) -> tuple[str, dict]:
        for n in self.nodes:
            if n not in exclude:
                self.records.append({"node": n, "created": False})
                return n, self.records[-1]
        raise InsufficientCapacity("pool is full")


def _create(core: Core, outcomes: dict[str, BaseException | None]) -> str:
    """The retry loop both pools run, over `outcomes` (node -> what its create raises)."""
    excluded: set[str] = set()
    while True:
        with _Attempt(core, object(), excluded) as at:  # type: ignore[arg-type]
            if outcomes[at.node_id] is not None:
                raise outcomes[at.node_id]
        if at.placed:
            return at.node_id


def test_full_and_unreachable_nodes_are_skipped_and_released() -> None:
    core = Core("a", "b", "c")
    assert _create(core, {"a": InsufficientCapacity("full"), "b": NodeLost("gone", node="b"), "c": None}) == "c"
    assert core.directory.calls == [
        ("reserve", "a"), ("release", "a", False),
        ("reserve", "b"), ("release", "b", False), ("dead", "b"),
        ("reserve", "c"), ("release", "c", True),
    ]
    assert [r["created"] for r in core.records] == [False, False, True]


def test_no_node_left_is_insufficient_capacity_and_other_errors_propagate() -> None:
    core = Core("a")
    with pytest.raises(InsufficientCapacity, match="pool is full"):
        _create(core, {"a": NodeUnavailable("down")})
    assert ("dead", "a") in core.directory.calls
    core = Core("a", "b")
    with pytest.raises(InvalidRequest):
        _create(core, {"a": InvalidRequest("bad plan"), "b": None})
    assert core.directory.calls == [("reserve", "a"), ("release", "a", False)]  # b never tried
