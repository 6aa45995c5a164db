"""The baseline strategies obey the same admission rule and do what their names say."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.cluster.placement import NodeView, PlacementIndex, PlacementRequest
from rollstack_bench.placement_baselines import STRATEGIES, BestOfK, LeastLoaded, RoundRobin, make, place_with
from rollstack.errors import InsufficientCapacity, InvalidRequest

GiB = 1 << 30


def node(nid, alive=True, cpu=8.0, mem=16 * GiB, slots=8, hot=()):
    return NodeView(nid, "u", alive, cpu, mem, slots, frozenset(hot), {})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(STRATEGIES), st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 8)), min_size=1, max_size=10),
       st.integers(1, 12))
def test_every_strategy_respects_admission_and_raises_when_full(name, specs, count):
    nodes = [node(f"n{i}", alive=a, slots=s, cpu=c * 0.5) for i, (a, s, c) in enumerate(specs)]
    room = sum(min(n.free_slots, int(n.free_cpu // 1.0)) for n in nodes if n.alive)
    req = PlacementRequest((("sha256:x", 10),), "t", 1.0, GiB, count)
    index = PlacementIndex(nodes)
    if room < count:
        with pytest.raises(InsufficientCapacity, match="the-pool"):
            place_with(make(name), req, index, pool="the-pool")
        assert index.slots.sum() == sum(n.free_slots for n in nodes)  # rolled back
        return
    got = place_with(make(name), req, index)
    by_id = {n.node_id: n for n in nodes}
    for nid in set(got):
        assert by_id[nid].alive and got.count(nid) <= min(by_id[nid].free_slots, int(by_id[nid].free_cpu))


def test_round_robin_cycles_over_admissible_nodes_in_order():
    index = PlacementIndex([node("a"), node("b", alive=False), node("c"), node("d", slots=1)])
    rr = RoundRobin()
    got = place_with(rr, PlacementRequest((), None, 1.0, GiB, 6), index)
    assert got == ["a", "c", "d", "a", "c", "a"]


def test_least_loaded_takes_the_emptiest_and_ignores_hot_layers():
    index = PlacementIndex([node("a", slots=2, hot={"sha256:x"}), node("b", slots=8)])
    assert place_with(LeastLoaded(), PlacementRequest((("sha256:x", 10),), None, 1.0, GiB), index) == ["b"]


def test_best_of_k_is_reproducible_and_k_equal_nodes_is_least_loaded():
    nodes = [node(f"n{i}", slots=i + 1) for i in range(6)]
    req = PlacementRequest((), None, 0.0, 0, 10)
    a = place_with(BestOfK(2, seed=7), req, PlacementIndex(nodes))
    assert a == place_with(BestOfK(2, seed=7), req, PlacementIndex(nodes))
    full = place_with(BestOfK(6), PlacementRequest((), None, 0.0, 0), PlacementIndex(nodes))
    assert full == ["n5"]
    with pytest.raises(InvalidRequest):
        BestOfK(0)


def test_unknown_strategy():
    with pytest.raises(InvalidRequest, match="round-robin"):
        make("random")
