"""Reading a ``/metrics`` page the way Prometheus would, written apart from the gateway's own code so the
dashboard is checked against an independent computation."""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

Series = list[tuple[dict[str, str], float]]


def parse(text: str) -> dict[str, Series]:
    """Samples by sample name (``spillgate_requests_total``, ``..._bucket``)."""
    samples: dict[str, Series] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), sample.value))
    return dict(samples)


def sum_by(samples: dict[str, Series], name: str, label: str) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, []):
        totals[labels[label]] += value
    return dict(totals)


def quantile(q: float, samples: dict[str, Series], histogram: str, backend: str) -> float:
    """``histogram_quantile(q, ...)`` for one backend: linear inside the bucket holding rank ``q * count``;
    the highest finite bound when that is the ``+Inf`` bucket."""
    buckets = sorted(
        (float(labels["le"]), value) for labels, value in samples[histogram + "_bucket"] if labels["backend"] == backend
    )
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    raise AssertionError("unreachable: the +Inf bucket holds every observation")
