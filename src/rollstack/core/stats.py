"""Sample statistics: the one `percentile` used by reports, benchmarks and the provisioner."""

from __future__ import annotations

import math
from typing import Iterable


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics.

    None and NaN values are ignored; no values gives None (never NaN, so a JSON report says
    `null` and arithmetic on a missing figure fails loudly); q outside 0..100 is a ValueError.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    xs = sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
