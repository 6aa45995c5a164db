import os
import signal

import pytest

from rollstack.interrupts import sigterm_as_interrupt


def test_sigterm_unwinds_like_ctrl_c_and_the_old_handler_returns():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before
