"""Link profiles and shaping parameters (pure)."""

from __future__ import annotations

import pytest

from rollstack_bench.link.netem import PROFILES, PROXY_OVERHEAD_S, LinkProfile, get_profile, tbf_burst_bytes
from rollstack.errors import InvalidRequest


def test_profiles_match_the_issue() -> None:
    assert (PROFILES["lan"].rate_bit, PROFILES["dc"].rate_bit, PROFILES["wan"].rate_bit) == (10e9, 1e9, 200e6)
    assert (PROFILES["lan"].rtt_s, PROFILES["dc"].rtt_s, PROFILES["wan"].rtt_s) == (0.0002, 0.002, 0.020)
    assert get_profile("dc") is PROFILES["dc"]
    custom = LinkProfile("x", 1, 0.01)
    assert get_profile(custom) is custom
    with pytest.raises(InvalidRequest):
        get_profile("moon")


def test_delay_accounts_for_the_proxy_hop() -> None:
    assert PROFILES["dc"].one_way_delay == pytest.approx((0.002 - PROXY_OVERHEAD_S) / 2)
    assert LinkProfile("z", 1, 0.0001).one_way_delay == 0.0


def test_burst_covers_gso_segments_and_scales() -> None:
    assert tbf_burst_bytes(1_000_000) == 256 * 1024
    assert tbf_burst_bytes(10_000_000_000) == 10_000_000_000 // 8 // 500
