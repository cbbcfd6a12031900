"""The arithmetic of live capacity advice: pure functions of what was measured, checkable by hand.

The fleet for a pool's peak is :func:`gateway.plan.live.pool_fleet`, :func:`gateway.plan.estimate.fleet` itself,
so the gateway's figure and ``spillgate plan``'s round the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from spillgate.gateway.plan.inputs import HostedPrices
from spillgate.gateway.plan.live import live_traffic, pool_fleet, replica_gpu
from spillgate.gateway.plan.results import Fleet

BUCKETS_PER_WINDOW = 10
"""Arrivals are counted in buckets a tenth of a rate window wide: a peak window may start at any tenth."""
SLO_SHARE = 0.95
"""A replica's throughput counts as "at the SLO" when at least this share of its requests met their SLO."""
MIN_WINDOW_REQUESTS = 10
"""Fewer requests in a window say too little about the SLO for its throughput to replace the configured one."""

Source = Literal["measured", "configured"]
Reason = Literal["demand", "pressure", "min_replicas"]


def peak_rate(counts: Sequence[float], bucket_s: float, window_buckets: int) -> tuple[float, int]:
    """The highest mean rate over ``window_buckets`` consecutive buckets (``counts`` oldest first), and how many
    buckets before the last one that window ends. A series shorter than a window is one window."""
    if not counts:
        return 0.0, 0
    span = min(window_buckets, len(counts))
    total = sum(counts[:span])
    best, best_end = total, span - 1
    for end in range(span, len(counts)):
        total += counts[end] - counts[end - span]
        if total > best:
            best, best_end = total, end
    return max(0.0, best) / (window_buckets * bucket_s), len(counts) - 1 - best_end


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica over one rate window: what it produced, how its requests fared against their tenants' SLOs,
    and how many load samples saw it saturated."""

    output_tokens: float
    finished: float
    """Requests that finished there with a verdict on the SLO (a first token came back)."""
    met_slo: float
    samples: float
    saturated: float
    """Samples where it queued requests or ran ``max_running`` of them, all of them this gateway's."""


def at_capacity(window: ReplicaWindow) -> bool:
    """The window shows what the replica sustains at the SLO: saturated at every sample (so its throughput was
    its limit, not the demand), with enough requests, and at least :data:`SLO_SHARE` of them within their SLO."""
    return (
        window.samples > 0
        and window.saturated >= window.samples
        and window.finished >= MIN_WINDOW_REQUESTS
        and window.met_slo >= SLO_SHARE * window.finished
        and window.output_tokens > 0
    )


def measured_output_tps(windows: Iterable[ReplicaWindow], window_s: float) -> tuple[float | None, int]:
    """The median output tok/s of the windows at capacity (any replica of the pool), and how many there were;
    ``None`` without any, when the configured figure stands."""
    rates = [w.output_tokens / window_s for w in windows if at_capacity(w)]
    return (statistics.median(rates) if rates else None), len(rates)


def pressure_floor(replicas: int, pressure_s: float, sustain_s: float) -> int | None:
    """One replica more than now once queueing or high KV usage has lasted ``sustain_s`` unbroken: a short
    blip adds nothing, since a replica takes minutes to start and the blip would be over by then."""
    return replicas + 1 if pressure_s >= sustain_s else None


@dataclass(frozen=True)
class PoolMeasures:
    """What the gateway measured of one pool over the lookback: the inputs of its advice."""

    pool: str
    replicas: int
    healthy_replicas: int
    peak_rps: float
    """Requests its replicas served plus those spilled to hosted as overflow or refused as over capacity, highest
    window mean."""
    peak_age_s: float
    """How long ago the peak window ended."""
    mean_rps: float
    requests: float
    overflow_requests: float
    overflow_usd: float
    """What the overflow spilled to hosted cost (at the providers' prices)."""
    refused_requests: float
    """Refused with 429 ``over_capacity``: a route that rejects what it cannot serve within the SLO."""
    mean_input_tokens: float | None
    mean_output_tokens: float | None
    """``None`` until a request with usage has been counted."""
    configured_output_tps: float
    measured_output_tps: float | None
    measured_windows: int
    queue_depth: int
    kv_usage: float
    """Mean KV cache usage over the pool's healthy replicas, last sampled."""
    pressure_s: float
    """How long the current unbroken run of pressure has lasted (0: none now)."""
    kept_floor: int | None
    """A replica count sustained pressure called for earlier in the lookback: kept, so scale-down waits."""
    gpu_usd_per_hour: float
    hosted_price: HostedPrices | None
    """The pool's routes' hosted price, per million tokens: what the same traffic would cost there."""


@dataclass(frozen=True)
class PoolAdvice:
    measures: PoolMeasures
    output_tps: float
    output_tps_source: Source
    fleet: Fleet | None
    """Replicas for the peak with headroom; ``None`` before any request's size is known."""
    pressure_sustained: bool
    pressure_floor: int | None
    recommended: int
    reason: Reason
    """Which term set ``recommended``."""


def advise(measures: PoolMeasures, *, headroom: float, sustain_s: float, min_replicas: int) -> PoolAdvice:
    """Recommended = max(min_replicas, replicas for the peak with headroom, pressure floor)."""
    measured = measures.measured_output_tps
    source: Source = "configured" if measured is None else "measured"
    output_tps = measures.configured_output_tps if measured is None else measured
    planned = None
    if measures.mean_output_tokens:
        mean_input = measures.mean_input_tokens or 0.0
        traffic = live_traffic(measures.peak_rps, mean_input, measures.mean_output_tokens, headroom)
        planned = pool_fleet(traffic, output_tps, replica_gpu(measures.pool, measures.gpu_usd_per_hour))
    demand = planned.replicas if planned is not None else 0
    now_floor = pressure_floor(measures.replicas, measures.pressure_s, sustain_s)
    floors = [f for f in (now_floor, measures.kept_floor) if f is not None]
    floor = max(floors) if floors else None
    recommended = max(min_replicas, demand, floor or 0)
    reason: Reason = "demand"
    if floor is not None and floor > max(demand, min_replicas):
        reason = "pressure"
    elif min_replicas > demand:
        reason = "min_replicas"
    return PoolAdvice(
        measures=measures,
        output_tps=output_tps,
        output_tps_source=source,
        fleet=planned,
        pressure_sustained=now_floor is not None,
        pressure_floor=floor,
        recommended=recommended,
        reason=reason,
    )
