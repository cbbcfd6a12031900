"""``GET /capacity`` and the capacity gauges of ``/metrics``: the recorder's measures, advised, per pool.

``/capacity`` is guarded as ``/metrics`` is (``metrics.token``, when set): it shows the same figures in more
detail. ``spillgate plan --from URL`` reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request

from spillgate.backends.hosted import Price
from spillgate.gateway.capacity.advice import PoolAdvice, advise
from spillgate.gateway.capacity.recorder import route_pools
from spillgate.gateway.control.config import CapacityConfig
from spillgate.gateway.observability.metrics import GatewayMetrics
from spillgate.gateway.plan.estimate import HOURS_PER_DAY
from spillgate.gateway.plan.inputs import HostedPrices
from spillgate.gateway.plan.render import clean_floats
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import require_metrics_token

JSON_VERSION = 1


@dataclass(frozen=True)
class CapacityReport:
    settings: CapacityConfig
    observed_s: float
    """How long the measurements have run (at most the lookback counts)."""
    pools: tuple[PoolAdvice, ...]


def hosted_prices(state: GatewayState) -> dict[str, HostedPrices]:
    """Each pool's cheapest hosted price among the routes it serves (their hosted model's, or reference_price):
    what its traffic would cost on a hosted API."""
    cheapest: dict[str, Price] = {}
    for name, pools in route_pools(state.config).items():
        route = state.routes.get(name)
        price = route.reference_price if route is not None else None
        if price is None:
            continue
        for pool in pools:
            known = cheapest.get(pool)
            if known is None or price.cost(1000, 200) < known.cost(1000, 200):
                cheapest[pool] = price
    return {pool: HostedPrices(p.input * 1e6, p.output * 1e6) for pool, p in cheapest.items()}


def capacity_report(state: GatewayState, now: float | None = None) -> CapacityReport:
    """Every configured pool's advice as of ``now`` (``time.perf_counter()`` seconds)."""
    now = time.perf_counter() if now is None else now
    recorder, settings = state.capacity, state.config.capacity
    backends = list(state.registry)
    prices = hosted_prices(state)
    pools = tuple(
        advise(
            recorder.measures(pool, backends, prices.get(pool.name), now),
            headroom=settings.headroom,
            sustain_s=settings.sustain_s,
            min_replicas=settings.min_replicas,
        )
        for pool in state.config.pools
    )
    return CapacityReport(settings, now - recorder.since, pools)


def _pool_json(advice: PoolAdvice, settings: CapacityConfig) -> dict[str, Any]:
    m, planned = advice.measures, advice.fleet
    hosted = m.hosted_price
    return {
        "pool": m.pool,
        "replicas": m.replicas,
        "healthy_replicas": m.healthy_replicas,
        "recommended_replicas": advice.recommended,
        "reason": advice.reason,
        "demand_replicas": planned.replicas if planned is not None else None,
        "headroom": settings.headroom,
        "min_replicas": settings.min_replicas,
        "demand": {
            "peak_rps": m.peak_rps,
            "peak_age_s": m.peak_age_s,
            "mean_rps": m.mean_rps,
            "requests": m.requests,
            "overflow_requests": m.overflow_requests,
            "overflow_usd": m.overflow_usd,
            "refused_requests": m.refused_requests,
            "mean_input_tokens": m.mean_input_tokens,
            "mean_output_tokens": m.mean_output_tokens,
        },
        "throughput": {
            "output_tps_per_replica": advice.output_tps,
            "source": advice.output_tps_source,
            "configured_output_tps": m.configured_output_tps,
            "measured_output_tps": m.measured_output_tps,
            "measured_windows": m.measured_windows,
            "rps_per_replica": planned.rps_per_replica if planned is not None else None,
            "required_rps": planned.required_rps if planned is not None else None,
        },
        "pressure": {
            "queue_depth": m.queue_depth,
            "kv_usage": m.kv_usage,
            "kv_high": settings.kv_high,
            "for_s": m.pressure_s,
            "sustain_s": settings.sustain_s,
            "sustained": advice.pressure_sustained,
            "floor": advice.pressure_floor,
        },
        "cost": {
            "gpu_usd_per_hour": m.gpu_usd_per_hour,
            "recommended_usd_per_day": advice.recommended * m.gpu_usd_per_hour * HOURS_PER_DAY,
            "hosted_price": None
            if hosted is None
            else {"input_per_mtok": hosted.input_per_mtok, "output_per_mtok": hosted.output_per_mtok},
        },
    }


def report_json(report: CapacityReport) -> dict[str, Any]:
    """The report as ``GET /capacity`` serves it, without float noise (as ``spillgate plan --json``)."""
    settings = report.settings
    return clean_floats(
        {
            "version": JSON_VERSION,
            "rate_window_s": settings.rate_window_s,
            "lookback_s": settings.lookback_s,
            "observed_s": report.observed_s,
            "pools": [_pool_json(advice, settings) for advice in report.pools],
        }
    )


def publish(metrics: GatewayMetrics, report: CapacityReport) -> None:
    """Set the capacity gauges for the pools configured now (a removed pool's series go)."""
    gauges = (
        metrics.recommended_replicas,
        metrics.pool_replicas,
        metrics.capacity_peak_rps,
        metrics.capacity_output_tps,
        metrics.capacity_pressure_seconds,
    )
    for gauge in gauges:
        gauge.clear()
    for advice in report.pools:
        m = advice.measures
        metrics.recommended_replicas.labels(m.pool).set(advice.recommended)
        metrics.pool_replicas.labels(m.pool).set(m.replicas)
        metrics.capacity_peak_rps.labels(m.pool).set(m.peak_rps)
        metrics.capacity_output_tps.labels(m.pool, advice.output_tps_source).set(advice.output_tps)
        metrics.capacity_pressure_seconds.labels(m.pool).set(m.pressure_s)


def capacity_router(state: GatewayState) -> APIRouter:
    router = APIRouter()

    @router.get("/capacity")
    async def capacity(request: Request) -> dict[str, Any]:
        """Replicas each pool needs now, and every figure that went into it (shape: ``report_json``)."""
        require_metrics_token(state.config.metrics.token, request.headers.get("authorization"), "/capacity")
        return report_json(capacity_report(state))

    return router
