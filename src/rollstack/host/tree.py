"""`remove_tree(path)`: remove a directory tree, whatever its depth.

Python 3.11's `shutil.rmtree` recurses once per directory level, so a tree deeper than the
interpreter's recursion limit (~1,000 levels: an environment can make one in its upper with a
shell loop) raises RecursionError, which `ignore_errors` does not catch: a teardown or a fork
layer's removal would fail for good. Such a tree is removed by `rm -rf --one-file-system`
(iterative, never crossing into a mount).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)


def remove_tree(path: Path | str) -> None:
    """Remove `path` and everything below it, errors ignored (what is left stays for the caller
    to check, as with `shutil.rmtree(ignore_errors=True)`)."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        log.info("%s is too deep for shutil.rmtree: removing it with rm -rf", path)
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
