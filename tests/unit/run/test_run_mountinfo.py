"""The classic overlay option string (mountinfo parsing is tests/unit/host)."""

from __future__ import annotations

from pathlib import Path

from rollstack.run.overlay import PINNED_OPTIONS, classic_options

def test_classic_options_order_top_first():
    opts = classic_options([Path("/l/top"), Path("/l/bottom")], Path("/u"), Path("/w"))
    assert opts.startswith("lowerdir=/l/top:/l/bottom,upperdir=/u,workdir=/w,")
    for k, v in PINNED_OPTIONS:
        assert f"{k}={v}" in opts
    assert opts.endswith(",volatile")  # the environment's upper is never synced


def test_classic_options_without_flags_for_old_kernels():
    opts = classic_options([Path("/l")], Path("/u"), Path("/w"), flags=False)
    assert "volatile" not in opts and opts.endswith("xino=off")
