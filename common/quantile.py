"""Percentiles of observed values, one rule everywhere: nearest rank, no interpolation,
so a p95 of 30 samples is a latency that was actually seen."""

from __future__ import annotations

import math
from collections.abc import Iterable


def nearest_rank(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 < q <= 1) of ``values`` by nearest rank; NaN when empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
