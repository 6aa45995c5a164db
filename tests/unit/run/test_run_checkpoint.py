"""Pure parts of rollstack.run.checkpoint."""

from __future__ import annotations

from rollstack.run.checkpoint import sigusr1_blocked

STATUS = "Name:\tinit\nSigPnd:\t0000000000000000\nSigBlk:\t{}\nSigIgn:\t0000000000000000\n"


def test_sigusr1_blocked_reads_bit_ten_of_sigblk() -> None:
    assert sigusr1_blocked(STATUS.format("0000000000014202"))  # execd: USR1, CHLD, TERM, INT
    assert sigusr1_blocked(STATUS.format("0000000000000200"))
    assert not sigusr1_blocked(STATUS.format("0000000000014002"))  # the rest, not USR1
    assert not sigusr1_blocked(STATUS.format("fffffffffffffdff"))
    assert not sigusr1_blocked("Name:\tinit\n")  # no SigBlk line: not ready
