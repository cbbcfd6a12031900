"""The dashboard's percentiles follow Prometheus' ``histogram_quantile`` to the edge cases."""

from __future__ import annotations

import math

import pytest

from spillgate.gateway.observability.dashboard.quantile import histogram_quantile

INF = math.inf
BUCKETS = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (INF, 10.0)]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.1, 0.05),  # rank 1 of 2 in the first bucket: half-way from 0
        (0.2, 0.1),  # rank 2: the first bucket's bound
        (0.5, 0.1 + 0.4 * (3 / 4)),  # rank 5: 3 of the second bucket's 4
        (0.8, 1.0),  # rank 8: the third bucket's bound
        (0.9, 1.0),  # rank 9 is in +Inf: the highest finite bound
        (0.0, 0.0),
    ],
)
def test_linear_inside_the_bucket(q: float, expected: float) -> None:
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)
    assert histogram_quantile(q, reversed(BUCKETS)) == pytest.approx(expected)  # order does not matter


def test_nothing_to_estimate_from_is_nan() -> None:
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))  # no observations
    assert math.isnan(histogram_quantile(0.5, [(INF, 3.0)]))  # fewer than two buckets
    assert math.isnan(histogram_quantile(0.5, [(0.1, 1.0), (1.0, 3.0)]))  # no +Inf bucket
    assert math.isnan(histogram_quantile(math.nan, BUCKETS))


def test_out_of_range_quantiles_and_non_positive_first_bound() -> None:
    assert histogram_quantile(-0.1, BUCKETS) == -INF
    assert histogram_quantile(1.1, BUCKETS) == INF
    assert histogram_quantile(0.1, [(-1.0, 2.0), (INF, 4.0)]) == -1.0


def test_repeated_bounds_add_up_and_counts_are_made_monotonic() -> None:
    assert histogram_quantile(0.5, [(1.0, 1.0), (1.0, 1.0), (2.0, 4.0), (INF, 4.0)]) == pytest.approx(1.0)
    # A bucket below its predecessor (a scrape racing an observation) is raised to it.
    assert histogram_quantile(0.5, [(1.0, 3.0), (2.0, 2.0), (INF, 4.0)]) == pytest.approx(2 / 3)
