"""One percentile rule for replay, the HTML report and the benches."""

from __future__ import annotations

import math

from codepool.common.quantile import nearest_rank


def test_nearest_rank_is_an_observed_value() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert nearest_rank(values, 0.5) == 3.0
    assert nearest_rank(values, 0.95) == 5.0
    assert nearest_rank(values, 0.2) == 1.0
    assert nearest_rank(list(range(1, 31)), 0.95) == 29  # ceil(28.5) = 29th of 30
    assert math.isnan(nearest_rank([], 0.5))
