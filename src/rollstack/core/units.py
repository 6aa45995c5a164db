"""Byte sizes: the one `parse_size` and the binary unit constants.

One meaning of each suffix everywhere (plans, CLI options, configs), Kubernetes-style:
binary `Ki`, `Mi`, `Gi`, `Ti` (2^10 ...), decimal `k`/`K`, `M`, `G`, `T` (10^3 ...), an optional
trailing `B` (`2GiB`, `512MB`), or plain bytes. So `512M` is 512 * 10^6 bytes and `512Mi` is
512 * 2^20. (Before this module the CLI read `M` as 2^20; `rollstack layer convert --chunk-size`
therefore takes `parse_binary_size`, which refuses a decimal suffix instead of silently
changing the blob it writes.)
"""

from __future__ import annotations

import re
from typing import Any

from rollstack.errors import InvalidRequest

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

UNITS: dict[str, int] = {
    "": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": TiB,
}
DECIMAL_SUFFIXES = frozenset({"k", "K", "M", "G", "T"})
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*?)B?\s*$")


def size_suffix(value: str) -> str | None:
    """The unit suffix of a size string (`""` for plain bytes), None when it is not a size."""
    m = _SIZE_RE.match(value)
    return m.group(2) if m and m.group(2) in UNITS else None


def parse_size(value: Any) -> int:
    """Bytes from `256Mi`, `1.5Gi`, `512M`, `1024` or a non-negative number; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            raise ValueError(f"{value!r} is not a size")
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2) in UNITS:
            return int(float(m.group(1)) * UNITS[m.group(2)])
    raise ValueError(f"{value!r} is not a size (use e.g. 256Mi, 4Gi, 512M or bytes)")


def parse_binary_size(text: str) -> int:
    """A size that must be given in bytes or binary units (`64Ki`, `1Mi`, `1MiB`): chunk sizes.

    A decimal suffix (`1M`) is refused, with the binary spelling in the message, rather than
    read: `rollstack layer convert --chunk-size 1M` used to mean 2^20, and reading it as 10^6
    now would silently change the blobs an old command line writes.
    """
    suffix = size_suffix(text)
    if suffix is None:
        raise InvalidRequest(f"not a size: {text!r} (examples: 65536, 64Ki, 1Mi, 1MiB)")
    if suffix in DECIMAL_SUFFIXES:
        raise InvalidRequest(f"size {text!r} uses a decimal unit ({suffix} = {UNITS[suffix]} bytes); "
                             f"write {text.strip().rstrip('Bb')}i for the binary size")
    return parse_size(text)
