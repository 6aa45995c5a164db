"""The node's counters: no increment is lost when many threads bump at once."""

from __future__ import annotations

import threading

import pytest

from rollstack.node.counters import Counters


def test_concurrent_bumps_all_count() -> None:
    c = Counters(("execs", "created"))
    threads = [threading.Thread(target=lambda: [c.bump("execs") for _ in range(5000)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c["execs"] == 40000 and c.snapshot() == {"execs": 40000, "created": 0}


def test_an_undeclared_counter_is_an_error() -> None:
    with pytest.raises(KeyError):
        Counters(("a",)).bump("b")
