"""Turn per-request results into a level's figures: percentiles, throughput, goodput, cache hit rate, shares.

Pure functions over finished results, so the math is checked on known inputs without running anything.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from spillgate.gateway.bench.arrivals import RateSchedule
from spillgate.gateway.bench.client import RequestResult

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile, interpolating linearly between closest ranks (numpy's default); ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Distribution:
    """p50/p95/p99 and mean, in milliseconds; all ``None`` when there were no samples."""

    p50: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    count: int

    @classmethod
    def of_seconds(cls, values: Sequence[float]) -> Distribution:
        millis = [value * 1000.0 for value in values]
        p50, p95, p99 = (percentile(millis, q) for q in PERCENTILES)
        mean = sum(millis) / len(millis) if millis else None
        return cls(p50=p50, p95=p95, p99=p99, mean=mean, count=len(millis))


@dataclass(frozen=True)
class Slo:
    """A request meets the SLO when it succeeded, its TTFT and its TPOT are within bounds.

    A reply of one token has no TPOT and so meets that half by definition.
    """

    ttft_ms: float
    tpot_ms: float

    def met(self, result: RequestResult) -> bool:
        if not result.ok or result.ttft is None or result.ttft * 1000.0 > self.ttft_ms:
            return False
        return result.tpot is None or result.tpot * 1000.0 <= self.tpot_ms


@dataclass(frozen=True)
class Summary:
    """One level's figures. Rates divide by ``duration_s``, from the first send to the last answer."""

    completed: int
    failed: int
    unfinished: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    goodput: float
    slo_attainment_pct: float | None
    ttft_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_hit_rate: float | None
    backends: dict[str, int]
    backend_shares_pct: dict[str, float]
    errors: dict[str, int]
    error_examples: dict[str, str]
    reasons: dict[str, int]
    """Requests per ``x-spillgate-reason`` (``-`` when the server sent none)."""

    @property
    def finished(self) -> int:
        return self.completed + self.failed


def summarize(results: Sequence[RequestResult], *, duration_s: float, unfinished: int, slo: Slo) -> Summary:
    """Figures over finished requests (``unfinished`` ones were cut off by a stop and are only counted).

    Latencies, tokens and the cache hit rate count successful requests; SLO attainment and backend shares
    count every finished one, failures included.
    """
    ok = [result for result in results if result.ok]
    failed = [result for result in results if not result.ok]
    duration = max(duration_s, 1e-9)
    prompt_tokens = sum(result.prompt_tokens for result in ok)
    cached_tokens = sum(result.cached_tokens for result in ok)
    completion_tokens = sum(result.completion_tokens for result in ok)
    met = sum(1 for result in results if slo.met(result))
    backends = Counter(result.backend for result in results)
    reasons = Counter(result.reason for result in results)
    errors = Counter(result.error or "" for result in failed)
    examples: dict[str, str] = {}
    for result in failed:
        examples.setdefault(result.error or "", result.detail)
    return Summary(
        completed=len(ok),
        failed=len(failed),
        unfinished=unfinished,
        duration_s=duration_s,
        request_throughput=len(ok) / duration,
        output_throughput=completion_tokens / duration,
        goodput=met / duration,
        slo_attainment_pct=100.0 * met / len(results) if results else None,
        ttft_ms=Distribution.of_seconds([r.ttft for r in ok if r.ttft is not None]),
        tpot_ms=Distribution.of_seconds([r.tpot for r in ok if r.tpot is not None]),
        e2e_ms=Distribution.of_seconds([r.e2e for r in ok]),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        cache_hit_rate=cached_tokens / prompt_tokens if prompt_tokens else None,
        backends=dict(backends.most_common()),
        backend_shares_pct={name: 100.0 * n / len(results) for name, n in backends.most_common()},
        errors=dict(errors.most_common()),
        error_examples=examples,
        reasons=dict(reasons.most_common()),
    )


@dataclass(frozen=True)
class PhaseSummary:
    """The figures of the requests one schedule phase sent, wherever in time they finished."""

    index: int
    label: str
    rate: float
    start_s: float
    end_s: float
    summary: Summary


def summarize_phases(
    results: Sequence[RequestResult], schedule: RateSchedule, *, slo: Slo, ran_s: float | None = None
) -> list[PhaseSummary]:
    """One summary per phase, over the requests whose scheduled arrival falls in it.

    Rates divide by the phase's length (cut at ``ran_s`` when the run stopped early), so a phase's request
    throughput is what it admitted and its goodput what met the SLO, per second of that phase: a burst's
    backlog answered after the burst still counts for the burst.
    """
    by_phase: list[list[RequestResult]] = [[] for _ in schedule.phases]
    for result in results:
        index = schedule.phase_at(result.scheduled if result.scheduled is not None else result.start)
        if index is not None:
            by_phase[index].append(result)
    out = []
    for index, (phase, (start, end)) in enumerate(zip(schedule.phases, schedule.bounds(), strict=True)):
        stop = end if ran_s is None else min(end, max(ran_s, start))
        summary = summarize(by_phase[index], duration_s=stop - start, unfinished=0, slo=slo)
        label = f"{phase.label or f'{phase.rate:g}'}:{phase.duration_s:g}"
        out.append(PhaseSummary(index, label, phase.rate, start, end, summary))
    return out
