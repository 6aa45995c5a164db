"""The daemon's command line maps onto FetchConfig (the client passes these flags)."""

from __future__ import annotations

from rollstack.fetch import FetchConfig
from rollstack.mount.daemon import parse_args

BASE = ["--mountpoint", "/m", "--state-dir", "/s", "--store", "oci:/x"]


def test_defaults_are_the_fetch_config_defaults():
    fc = parse_args(BASE).fetch
    d = FetchConfig()
    assert (fc.background_grace, fc.background_quiet, fc.background_share, fc.link_rate, fc.fetch_on_open) == \
        (d.background_grace, d.background_quiet, d.background_share, d.link_rate, d.fetch_on_open)


def test_background_and_open_flags():
    fc = parse_args(BASE + ["--background-grace", "0", "--background-quiet", "0.25", "--background-share", "0.1",
                            "--link-rate", "1e9", "--fetch-on-open"]).fetch
    assert fc.background_grace == 0.0 and fc.background_quiet == 0.25 and fc.background_share == 0.1
    assert fc.link_rate == 1e9 and fc.fetch_on_open is True
