"""SIGTERM handled like Ctrl-C, for long jobs that own real resources (demo, benchmarks).

Inside `sigterm_as_interrupt()`, SIGTERM raises KeyboardInterrupt in the main thread, so every
`finally` that unmounts, deletes a netns or stops a node runs. A job started in the background
ignores SIGINT, so `kill PID` is how it is stopped. Outside the main thread (where Python cannot
install handlers) the context manager does nothing.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
