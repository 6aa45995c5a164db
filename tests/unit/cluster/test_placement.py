"""Properties of `rollstack.cluster.placement.place` (hypothesis) plus a few pinned examples."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstack.cluster.placement import NodeView, PlacementIndex, PlacementPolicy, PlacementRequest, place
from rollstack.errors import InsufficientCapacity, InvalidRequest

GiB = 1 << 30
DIGESTS = [f"sha256:{i:02d}" for i in range(8)]
SIZES = {d: (i + 1) * 10_000_000 for i, d in enumerate(DIGESTS)}
KEYS = ["task-a", "task-b", "task-c"]


def node(nid, *, alive=True, cpu=8.0, mem=16 * GiB, slots=8, hot=(), groups=None):
    return NodeView(nid, f"http://{nid}:7878", alive, cpu, mem, slots, frozenset(hot), dict(groups or {}))


@st.composite
def views(draw, min_nodes=1, max_nodes=12):
    n = draw(st.integers(min_nodes, max_nodes))
    ids = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=n, max_size=n, unique=True))
    out = []
    for nid in ids:
        out.append(node(
            nid, alive=draw(st.booleans()) or draw(st.booleans()),
            cpu=draw(st.integers(0, 16)) * 0.5, mem=draw(st.integers(0, 8)) * GiB // 2,
            slots=draw(st.integers(0, 6)),
            hot=draw(st.frozensets(st.sampled_from(DIGESTS), max_size=5)),
            groups=draw(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 10), max_size=2))))
    return out


@st.composite
def requests(draw, max_count=20, keyed=False):
    layers = draw(st.lists(st.sampled_from(DIGESTS), max_size=5, unique=True))
    key = st.sampled_from(KEYS) if keyed else st.one_of(st.none(), st.sampled_from(KEYS))
    return PlacementRequest(tuple((d, SIZES[d]) for d in layers), draw(key),
                            draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
                            draw(st.sampled_from([0, GiB // 2, GiB])),
                            draw(st.integers(1, max_count)))


def capacity(n: NodeView, r: PlacementRequest) -> int:
    """How many envs of `r` the node can admit (identical envs, so greedy is exact)."""
    if not n.alive:
        return 0
    cap = n.free_slots
    if r.cpu:
        cap = min(cap, math.floor(n.free_cpu / r.cpu))
    if r.memory:
        cap = min(cap, n.free_memory // r.memory)
    return max(cap, 0)


policies = st.builds(PlacementPolicy, spread_limit=st.integers(1, 5),
                     hot_weight=st.sampled_from([0.0, 1.0, 2.0, 5.0]), load_weight=st.sampled_from([0.0, 1.0]),
                     load_band=st.sampled_from([None, 0.0, 0.125, 0.5]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views(), requests(), policies, st.data())
def test_placed_only_where_admissible_and_raises_exactly_when_the_pool_is_full(nodes, req, policy, data):
    exclude = frozenset(data.draw(st.lists(st.sampled_from([n.node_id for n in nodes]), max_size=3)))
    room = sum(capacity(n, req) for n in nodes if n.node_id not in exclude)
    by_id = {n.node_id: n for n in nodes}
    if room < req.count:
        with pytest.raises(InsufficientCapacity) as err:
            place(req, nodes, policy, exclude, pool="pool-x")
        assert "pool-x" in str(err.value)
        assert err.value.details["pool"] == "pool-x" and err.value.details["needed"] == req.count
        assert err.value.code == "insufficient_capacity"
        return
    got = place(req, nodes, policy, exclude)
    assert len(got) == req.count
    for nid in set(got):
        n = by_id[nid]
        assert n.alive and nid not in exclude
        k = got.count(nid)
        assert k <= capacity(n, req)  # slots, cores and memory, across the whole batch


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views(min_nodes=2), requests(max_count=12, keyed=True), policies)
def test_group_stays_on_a_node_below_spread_limit_and_spreads_beyond_it(nodes, req, policy):
    """Replays the batch decision by decision: whenever some admissible node holds 1..limit-1 of
    the group, the choice is such a node; whenever some admissible node holds < limit, the choice
    holds < limit."""
    if sum(capacity(n, req) for n in nodes) < req.count:
        return
    got = place(req, nodes, policy)
    left = {n.node_id: capacity(n, req) for n in nodes}
    held = {n.node_id: n.groups.get(req.trace_key, 0) for n in nodes}
    lim = policy.spread_limit
    for nid in got:
        open_ = [m for m, c in left.items() if c > 0]
        assert nid in open_
        if any(0 < held[m] < lim for m in open_):
            assert 0 < held[nid] < lim, (nid, held, left)
        if any(held[m] < lim for m in open_):
            assert held[nid] < lim
        left[nid] -= 1
        held[nid] += 1


def test_fresh_group_of_spread_limit_lands_on_one_node_then_spreads():
    nodes = [node(f"n{i}", slots=20, cpu=20) for i in range(4)]
    req = PlacementRequest((), "t", 1.0, GiB, count=8)
    assert len(set(place(req, nodes, PlacementPolicy(spread_limit=8)))) == 1
    got = place(PlacementRequest((), "t", 1.0, GiB, count=24), nodes, PlacementPolicy(spread_limit=8))
    assert sorted(got.count(n) for n in set(got)) == [8, 8, 8]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.frozensets(st.sampled_from(DIGESTS), max_size=8), min_size=1, max_size=10), requests(max_count=1))
def test_prefers_the_node_with_most_hot_bytes_of_the_stack(hots, req):
    nodes = [node(f"n{i:02d}", hot=h) for i, h in enumerate(hots)]  # equal capacity, no groups
    req = PlacementRequest(req.layers, None, 1.0, GiB)
    [nid] = place(req, nodes)
    hot_bytes = {n.node_id: sum(s for d, s in req.layers if d in n.hot_layers) for n in nodes}
    assert hot_bytes[nid] == max(hot_bytes.values())
    # ties (same hot bytes) go to the smallest node_id
    assert nid == min(k for k, v in hot_bytes.items() if v == hot_bytes[nid])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views(), requests(), policies, st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_the_order_of_the_view(nodes, req, policy, rnd):
    shuffled = list(nodes)
    rnd.shuffle(shuffled)
    try:
        a = place(req, nodes, policy)
    except InsufficientCapacity:
        with pytest.raises(InsufficientCapacity):
            place(req, shuffled, policy)
        return
    assert place(req, shuffled, policy) == a == place(req, nodes, policy)


def test_identical_nodes_tie_break_on_node_id_and_load_spreads_groupless_envs():
    nodes = [node(x) for x in ("c", "a", "b")]
    assert place(PlacementRequest((), None, 1.0, GiB), nodes) == ["a"]
    assert place(PlacementRequest((), None, 1.0, GiB, count=3), nodes) == ["a", "b", "c"]


def test_hot_node_wins_over_an_emptier_cold_one_and_then_carries_the_stack():
    stack = (("sha256:base", 900), ("sha256:task", 100))
    nodes = [node("cold", slots=16), node("warm", slots=15, hot={"sha256:base"})]  # load within the band
    assert place(PlacementRequest(stack, None, 1.0, GiB), nodes) == ["warm"]
    # without the hot term it is least-loaded
    assert place(PlacementRequest(stack, None, 1.0, GiB), nodes, PlacementPolicy(hot_weight=0)) == ["cold"]
    # a load gap beyond the band (4 of 16 slots) beats hot layers; without the band the hot node still wins
    nodes = [node("cold", slots=16), node("warm", slots=12, hot={"sha256:base"})]
    assert place(PlacementRequest(stack, None, 1.0, GiB), nodes) == ["cold"]
    assert place(PlacementRequest(stack, None, 1.0, GiB), nodes, PlacementPolicy(load_band=None)) == ["warm"]


def test_dead_excluded_and_full_nodes_are_skipped():
    nodes = [node("a", alive=False), node("b", slots=0), node("c", cpu=0.5), node("d", mem=0), node("e"), node("f")]
    assert place(PlacementRequest((), None, 1.0, GiB), nodes, exclude=frozenset({"e"})) == ["f"]


def test_full_pool_names_the_pool_and_a_failed_batch_leaves_the_index_untouched():
    nodes = [node("a", slots=2, hot={"sha256:x"}), node("b", slots=1)]
    index = PlacementIndex(nodes)
    before = (index.cpu.copy(), index.mem.copy(), index.slots.copy(), {k: v.copy() for k, v in index.hot.items()},
              {k: dict(v) for k, v in index.groups.items()})
    req = PlacementRequest((("sha256:x", 5), ("sha256:y", 7)), "g", 1.0, GiB, count=4)
    with pytest.raises(InsufficientCapacity, match="gpu-pool") as err:
        place(req, index, pool="gpu-pool")
    assert err.value.details == {"pool": "gpu-pool", "needed": 4, "placed": 3}
    assert all(np.array_equal(x, y) for x, y in zip(before[:3], (index.cpu, index.mem, index.slots)))
    assert {k: v for k, v in index.hot.items() if v.any()}.keys() == before[3].keys()
    assert all(np.array_equal(index.hot[k], v) for k, v in before[3].items())
    assert index.groups == before[4]
    # a batch that fits is charged to the index: the next call sees it
    assert place(PlacementRequest(req.layers, "g", 1.0, GiB, count=3), index) == ["a", "a", "b"]
    with pytest.raises(InsufficientCapacity):
        place(PlacementRequest((), None, 0.0, 0), index)


def test_index_release_gives_capacity_and_group_back():
    index = PlacementIndex([node("a", slots=1)])
    req = PlacementRequest((("sha256:x", 5),), "g", 1.0, GiB)
    assert place(req, index) == ["a"]
    assert index.groups == {"g": {0: 1}} and index.hot["sha256:x"][0]
    index.release(0, req)
    assert index.groups == {} and index.slots[0] == 1 and index.hot["sha256:x"][0]  # layers stay hot
    index.forget_layer(0, "sha256:x")
    assert not index.hot["sha256:x"][0]


@pytest.mark.parametrize("req, policy", [
    (PlacementRequest((), None, 1.0, GiB, count=0), PlacementPolicy()),
    (PlacementRequest((), None, -1.0, GiB), PlacementPolicy()),
    (PlacementRequest((("sha256:x", -1),), None, 1.0, GiB), PlacementPolicy()),
    (PlacementRequest((), None, 1.0, GiB), PlacementPolicy(spread_limit=0)),
])
def test_bad_requests_are_invalid(req, policy):
    with pytest.raises(InvalidRequest):
        place(req, [node("a")], policy)


def test_duplicate_node_ids_are_invalid():
    with pytest.raises(InvalidRequest, match="twice"):
        place(PlacementRequest((), None, 1.0, GiB), [node("a"), node("a")])


def test_empty_view_is_a_full_pool():
    with pytest.raises(InsufficientCapacity, match="pool"):
        place(PlacementRequest((), None, 1.0, GiB), [])


def test_a_thousand_node_view_places_a_big_batch_consistently():
    rng = random.Random(1)
    layers = [(f"sha256:{i}", rng.randrange(1, 10**9)) for i in range(100)]
    nodes = [node(f"n{i:04d}", cpu=32, mem=64 * GiB, slots=16,
                  hot={d for d, _ in rng.sample(layers, 20)}) for i in range(1000)]
    index = PlacementIndex(nodes)
    for k in range(2000):
        place(PlacementRequest(tuple(rng.sample(layers, 4)), f"t{k // 8}", 1.0, GiB), index)
    assert index.slots.min() >= 0 and index.slots.sum() == 16_000 - 2000
    assert all(max(g.values()) <= 8 for g in index.groups.values())


@pytest.mark.parametrize("reserve, colocated", [(True, True), (False, False)])
def test_group_reservation_keeps_interleaved_groups_whole(reserve, colocated):
    """Rollout 1 of four tasks, then rollout 2 of each, ...: with reservations every group ends
    on one node although the stack is hot on one node only; without, the hot node fills with
    first rollouts and the groups split."""
    stack = (("sha256:os", 1000),)
    policy = PlacementPolicy(group_reserve=reserve, load_band=None)  # the reservation alone (no load band)
    index = PlacementIndex([node("a", slots=16, cpu=16, hot={"sha256:os"}), node("b", slots=16, cpu=16)], policy)
    where: dict[str, set[str]] = {}
    for r in range(8):
        for t in range(4):
            [nid] = place(PlacementRequest(stack, f"t{t}", 1.0, GiB), index, policy)
            where.setdefault(f"t{t}", set()).add(nid)
    assert all(len(v) == 1 for v in where.values()) is colocated
    assert index.slots.sum() == 0  # full
    if reserve:
        assert index.res.sum() == 0  # every reservation consumed by its group


def test_an_index_built_for_another_spread_limit_is_refused():
    index = PlacementIndex([node("a")], PlacementPolicy(spread_limit=4))
    with pytest.raises(InvalidRequest, match="spread_limit 4"):
        place(PlacementRequest((), "g", 1.0, GiB), index, PlacementPolicy(spread_limit=8))
    assert place(PlacementRequest((), "g", 1.0, GiB), index, PlacementPolicy(spread_limit=4)) == ["a"]


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 8), st.integers(8, 64), st.data(), st.booleans())
def test_different_tasks_on_equal_nodes_holding_the_stack_spread_evenly(n, slots, data, keyed):
    """N one-env requests of different tasks (or none), every node holding the stack and equal
    capacity: the pool spreads them, no node more than one env ahead of another."""
    count = data.draw(st.integers(1, n * slots))
    stack = tuple((d, SIZES[d]) for d in DIGESTS[:3])
    index = PlacementIndex([node(f"n{i}", slots=slots, cpu=slots, mem=slots * GiB, hot={d for d, _ in stack})
                            for i in range(n)])
    for t in range(count):
        place(PlacementRequest(stack, f"task-{t}" if keyed else None, 1.0, GiB), index)
    used = slots - index.slots
    assert used.sum() == count and used.max() - used.min() <= 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.frozensets(st.sampled_from(DIGESTS), max_size=8), min_size=2, max_size=8), st.integers(8, 64),
       st.sampled_from([0.0, 0.125, 0.25]), st.data())
def test_hot_layers_win_only_among_nodes_of_comparable_load(hots, slots, band, data):
    """Different tasks, arbitrary hot sets: every decision goes to a node whose free fraction is
    within `load_band` of the emptiest node's, so the load gap stays bounded (band x slots + the
    reservation of one group) however hot one node is."""
    policy = PlacementPolicy(load_band=band)
    index = PlacementIndex([node(f"n{i}", slots=slots, cpu=slots, mem=slots * GiB, hot=h) for i, h in enumerate(hots)],
                           policy)
    layers = tuple((d, SIZES[d]) for d in DIGESTS[:4])
    for t in range(data.draw(st.integers(1, len(hots) * slots))):
        free = index.free_fraction(reserved=True)
        ok = index.feasible(PlacementRequest(layers, None, 1.0, GiB))
        [nid] = place(PlacementRequest(layers, f"task-{t}", 1.0, GiB), index, policy)
        assert free[index.pos[nid]] >= free[ok].max() - band - 1e-9
    used = slots - index.slots
    assert used.max() - used.min() <= band * slots + policy.spread_limit + 1


def test_sixty_four_slot_nodes_spread_a_small_iteration():
    """The case seen live: 16 rollouts of 2 tasks and 16 single envs of different tasks on four
    empty 64-slot nodes; the stack hot on none. Groups stay whole; tasks spread over the nodes."""
    stack = (("sha256:os", 100_000_000), ("sha256:repo", 50_000_000))
    index = PlacementIndex([node(f"n{i}", slots=64, cpu=64, mem=64 * GiB) for i in range(4)])
    groups = {t: {place(PlacementRequest(stack, f"g{t}", 1.0, GiB), index)[0] for _ in range(8)} for t in range(2)}
    assert all(len(v) == 1 for v in groups.values()) and groups[0] != groups[1]
    for t in range(16):
        place(PlacementRequest(stack, f"solo-{t}", 1.0, GiB), index)
    used = 64 - index.slots
    assert used.min() >= 4 and used.max() - used.min() <= 8 + 1
