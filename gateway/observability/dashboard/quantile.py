"""``histogram_quantile`` as Prometheus computes it, so the dashboard's percentiles equal a PromQL query's."""

from __future__ import annotations

import math
from collections.abc import Iterable


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The ``q``-quantile of cumulative ``(upper_bound, count)`` buckets, interpolated linearly inside the
    bucket the rank falls in (Prometheus' ``bucketQuantile``); NaN when there is nothing to estimate from.

    A rank in the ``+Inf`` bucket returns the highest finite bound, as Prometheus does."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = _coalesced(sorted(buckets))
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]):
        return math.nan
    _monotonic(ordered)
    observations = ordered[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i, (_, count) in enumerate(ordered[:-1]) if count >= rank), len(ordered) - 1)
    if b == len(ordered) - 1:
        return ordered[-2][0]
    if b == 0 and ordered[0][0] <= 0:
        return ordered[0][0]
    start, end, count = 0.0, ordered[b][0], ordered[b][1]
    if b > 0:
        start = ordered[b - 1][0]
        count -= ordered[b - 1][1]
        rank -= ordered[b - 1][1]
    return start + (end - start) * (rank / count)


def _coalesced(buckets: list[tuple[float, float]]) -> list[list[float]]:
    """Buckets with the same bound are summed (series of one histogram from several sources)."""
    merged: list[list[float]] = []
    for bound, count in buckets:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    return merged


def _monotonic(buckets: list[list[float]]) -> None:
    """Cumulative counts never decrease; Prometheus forces them up the same way."""
    peak = -math.inf
    for bucket in buckets:
        peak = max(peak, bucket[1])
        bucket[1] = peak
