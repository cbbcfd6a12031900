"""The report's math on known inputs: percentiles, SLO attainment, goodput, cache hit rate, backend shares."""

from __future__ import annotations

import random
from itertools import islice, pairwise

import pytest

from spillgate.gateway.bench.arrivals import poisson_offsets
from spillgate.gateway.bench.client import RequestResult
from spillgate.gateway.bench.stats import Distribution, Slo, percentile, summarize


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 95) == pytest.approx(95.05)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5), "order of the input does not matter"
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_distribution_is_in_milliseconds() -> None:
    dist = Distribution.of_seconds([0.1, 0.2, 0.3])
    assert (dist.p50, dist.mean, dist.count) == (pytest.approx(200.0), pytest.approx(200.0), 3)
    assert Distribution.of_seconds([]).p99 is None


def ok(ttft: float, tpot: float | None, *, backend: str = "a", prompt: int = 100, cached: int = 0) -> RequestResult:
    return RequestResult(
        start=0.0,
        ok=True,
        status=200,
        backend=backend,
        ttft=ttft,
        tpot=tpot,
        e2e=1.0,
        prompt_tokens=prompt,
        completion_tokens=10,
        cached_tokens=cached,
    )


def test_slo_needs_success_ttft_and_tpot() -> None:
    slo = Slo(ttft_ms=1000, tpot_ms=50)
    assert slo.met(ok(0.5, 0.04))
    assert slo.met(ok(1.0, 0.05)), "bounds are inclusive"
    assert not slo.met(ok(1.2, 0.01))
    assert not slo.met(ok(0.2, 0.06))
    assert slo.met(ok(0.2, None)), "a one-token reply has no TPOT to miss"
    assert not slo.met(RequestResult(start=0.0, error="http_502", status=502))


def test_summary_goodput_attainment_cache_and_shares() -> None:
    results = [
        ok(0.1, 0.01, backend="a", prompt=1000, cached=800),  # meets
        ok(0.2, 0.02, backend="b", prompt=1000, cached=0),  # meets
        ok(2.0, 0.01, backend="a", prompt=1000, cached=700),  # TTFT too slow
        ok(0.1, 0.09, backend="b", prompt=1000, cached=500),  # TPOT too slow
        RequestResult(start=0.0, error="http_503", status=503, detail="no healthy backend"),
    ]
    summary = summarize(results, duration_s=2.0, unfinished=1, slo=Slo(ttft_ms=1000, tpot_ms=50))
    assert (summary.completed, summary.failed, summary.unfinished) == (4, 1, 1)
    assert summary.goodput == pytest.approx(1.0), "2 requests met both SLOs in 2 s"
    assert summary.slo_attainment_pct == pytest.approx(40.0), "2 of 5 finished requests"
    assert summary.request_throughput == pytest.approx(2.0)
    assert summary.output_throughput == pytest.approx(20.0)
    assert summary.cache_hit_rate == pytest.approx(2000 / 4000)
    assert summary.backends == {"a": 2, "b": 2, "-": 1}
    assert sum(summary.backend_shares_pct.values()) == pytest.approx(100.0)
    assert summary.backend_shares_pct["a"] == pytest.approx(40.0)
    assert summary.errors == {"http_503": 1}
    assert summary.error_examples["http_503"] == "no healthy backend"
    assert summary.ttft_ms.count == 4


def test_summary_of_nothing() -> None:
    summary = summarize([], duration_s=0.0, unfinished=0, slo=Slo(1000, 50))
    assert summary.slo_attainment_pct is None and summary.cache_hit_rate is None
    assert summary.goodput == 0.0 and summary.ttft_ms.p50 is None


def test_poisson_arrivals_have_the_asked_mean_rate() -> None:
    rate, n = 10.0, 20_000
    offsets = list(islice(poisson_offsets(rate, random.Random(42)), n + 1))
    assert offsets[0] == 0.0
    gaps = [b - a for a, b in pairwise(offsets)]
    mean = sum(gaps) / n
    assert mean == pytest.approx(1 / rate, rel=0.03)
    std = (sum((gap - mean) ** 2 for gap in gaps) / n) ** 0.5
    assert std / mean == pytest.approx(1.0, rel=0.05), "exponential gaps: standard deviation equals the mean"
    assert all(gap >= 0 for gap in gaps)
    again = list(islice(poisson_offsets(rate, random.Random(42)), n + 1))
    assert again == offsets, "the same seed gives the same schedule"
