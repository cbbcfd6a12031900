"""One function per dashboard panel, each a pure function of a registry read (and the backends' live
state for load), so every figure is the one a PromQL query over ``/metrics`` would give."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from spillgate.backends.backend import Backend
from spillgate.gateway.accounting.rent import PoolRent
from spillgate.gateway.observability.dashboard.quantile import histogram_quantile
from spillgate.gateway.observability.dashboard.samples import Samples, keys, one

QUANTILES = (0.5, 0.95, 0.99)
SPILL_REASONS = frozenset({"overflow", "complex", "fallback"})
"""Reasons that send a request off the replicas (``fallback`` may also land on a replica)."""

Panel = dict[str, Any]


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def requests_by_reason(samples: Samples, kinds: Mapping[str, str]) -> Panel:
    """``sum by (reason) (spillgate_requests_total)``, split by the kind of backend that served them."""
    cells = samples.sum_by("spillgate_requests_total", "reason", "backend", "outcome")
    rows: dict[str, dict[str, Any]] = {}
    for (reason, backend, outcome), count in cells.items():
        row = rows.setdefault(reason, {"reason": reason, "total": 0.0, "replica": 0.0, "hosted": 0.0, "failed": 0.0})
        row["total"] += count
        kind = kinds.get(backend)  # a backend a config reload removed counts in the total only
        if kind in ("replica", "hosted"):
            row[kind] += count
        if outcome != "ok":
            row["failed"] += count
    ordered = sorted(rows.values(), key=lambda r: (-r["total"], r["reason"]))
    for row in ordered:
        row["spill"] = row["reason"] in SPILL_REASONS
    return {"rows": ordered, "total": sum(cells.values())}


def complexity(samples: Samples) -> Panel:
    """Per route: the share of its requests the complexity score sent to the top tier (reason ``complex``), and
    what those requests cost."""
    requests = samples.sum_by("spillgate_requests_total", "route", "reason")
    spend = samples.sum_by("spillgate_spend_usd_total", "route", "reason")
    totals: dict[str, float] = {}
    for (route, _), count in requests.items():
        totals[route] = totals.get(route, 0.0) + count
    rows = [
        {
            "route": route,
            "requests": total,
            "complex": requests.get((route, "complex"), 0.0),
            "complex_share": _ratio(requests.get((route, "complex"), 0.0), total),
            "complex_spend_usd": spend.get((route, "complex"), 0.0),
        }
        for route, total in sorted(totals.items())
    ]
    return {"routes": rows, "complex_spend_usd": sum(r["complex_spend_usd"] for r in rows)}


REFUSALS = "spillgate_refusals_total"


def refusals(samples: Samples, tenant: str | None) -> Panel:
    """``sum by (status, code) (spillgate_refusals_total)``: requests answered with an error before any backend
    had them (a bad key or body, a limit, no capacity), which the ledger never sees; only ``tenant``'s when
    given (counted under its name only with ``metrics.tenant_labels``)."""
    where = None if tenant is None else (lambda labels: labels.get("tenant") == tenant)
    cells = samples.sum_by(REFUSALS, "status", "code", where=where)
    rows = [{"status": status, "code": code, "requests": n} for (status, code), n in cells.items() if n]
    rows.sort(key=lambda r: (-r["requests"], r["status"], r["code"]))
    return {"rows": rows, "total": sum(r["requests"] for r in rows)}


def spend(samples: Samples) -> Panel:
    """``spillgate_spend_usd_total`` summed by kind, by tenant label and by route."""
    name = "spillgate_spend_usd_total"
    return {
        "total_usd": sum(samples.sum_by(name).values()),
        "by_kind": {k: v for (k,), v in samples.sum_by(name, "kind").items()},
        "by_tenant": {t: v for (t,), v in samples.sum_by(name, "tenant").items()},
        "by_route": {r: v for (r,), v in samples.sum_by(name, "route").items()},
    }


def rent(pools: Sequence[PoolRent]) -> Panel:
    """Per pool: the rent since the gateway started, how much of it requests used, the idle part, the cost of
    a million tokens at that utilization against the hosted price of the same tokens, and the utilization at
    which the two are equal; per tenant, its share of the rent (the shares add up to the rent)."""
    rows = []
    tenants: dict[str, float] = {}
    for pool in pools:
        rows.append(
            {
                "pool": pool.pool,
                "replicas": pool.replicas,
                "usd_per_hour": pool.usd_per_hour,
                "since": pool.since,
                "until": pool.until,
                "rent_usd": pool.rent_usd,
                "idle_usd": pool.idle_usd,
                "used_usd": pool.rent_usd - pool.idle_usd,
                "utilization": pool.utilization,
                "usd_per_mtok": pool.usd_per_mtok,
                "hosted_usd_per_mtok": pool.hosted_usd_per_mtok,
                "break_even_utilization": pool.break_even_utilization,
                "by_tenant": {name: share.rent_usd for name, share in pool.by_tenant.items()},
            }
        )
        for name, share in pool.by_tenant.items():
            tenants[name] = tenants.get(name, 0.0) + share.rent_usd
    return {
        "pools": rows,
        "rent_usd": sum(p.rent_usd for p in pools),
        "idle_usd": sum(p.idle_usd for p in pools),
        "by_tenant": dict(sorted(tenants.items())),
    }


def savings(samples: Samples, pools: Sequence[PoolRent], baselined: Collection[str]) -> Panel:
    """Per route: what its traffic would have cost on its hosted model (or reference price), minus its hosted
    spend and its share of the rent. A route with neither price has no baseline: its savings are unknown,
    not zero. The total also pays the rent no request used any of (a pool that served nothing)."""
    equivalent = samples.sum_by("spillgate_hosted_equivalent_usd_total", "route")
    hosted = samples.sum_by("spillgate_spend_usd_total", "route", "kind")
    route_rent: dict[str, float] = {}
    for pool in pools:
        for route, share in pool.by_route.items():
            route_rent[route] = route_rent.get(route, 0.0) + share.rent_usd
    rows = []
    for (route,), baseline in sorted(equivalent.items()):
        known = route in baselined
        spent = one(hosted, route, "hosted") + route_rent.get(route, 0.0)
        rows.append(
            {
                "route": route,
                "hosted_equivalent_usd": baseline if known else None,
                "hosted_usd": one(hosted, route, "hosted"),
                "rent_usd": route_rent.get(route, 0.0),
                "spend_usd": spent,
                "savings_usd": baseline - spent if known else None,
            }
        )
    unused = sum(p.rent_usd for p in pools if not p.busy_seconds)
    known_rows = [r for r in rows if r["savings_usd"] is not None]
    baseline_total = sum(r["hosted_equivalent_usd"] for r in known_rows)
    spend_total = sum(r["spend_usd"] for r in known_rows) + unused
    return {
        "routes": rows,
        "hosted_equivalent_usd": baseline_total,
        "spend_usd": spend_total,
        "unused_rent_usd": unused,
        "savings_usd": baseline_total - spend_total,
        "savings_ratio": _ratio(baseline_total - spend_total, baseline_total),
        "unknown_routes": [r["route"] for r in rows if r["savings_usd"] is None],
    }


def latency(samples: Samples, histogram: str, backends: Iterable[Backend], *, counts: bool) -> list[Panel]:
    """p50/p95/p99 per backend, as ``histogram_quantile(q, sum by (le, backend) (..._bucket))`` gives them
    over the process's life; ``counts`` adds the number of observations (admins only)."""
    buckets = samples.buckets(histogram, "backend")
    rows = []
    for backend in backends:
        series = buckets.get(backend.name)
        if not series:
            continue
        row: Panel = {"backend": backend.name, "kind": backend.kind}
        for q in QUANTILES:
            row[f"p{round(q * 100)}"] = _finite(histogram_quantile(q, series))
        if counts:
            row["count"] = max(count for _, count in series)
        rows.append(row)
    return rows


def cache_hits(samples: Samples, backends: Iterable[Backend], *, counts: bool) -> list[Panel]:
    """Per replica: ``kind="cached"`` over ``kind="prompt"`` prompt tokens, and what the prefix index
    predicted (``kind="predicted_cached"``): how far routing's belief is from the replica's report."""
    tokens = samples.sum_by("spillgate_prompt_tokens_total", "backend", "kind")
    rows = []
    for backend in backends:
        if backend.kind != "replica":
            continue
        prompt = one(tokens, backend.name, "prompt")
        row: Panel = {
            "backend": backend.name,
            "hit_rate": _ratio(one(tokens, backend.name, "cached"), prompt),
            "predicted_hit_rate": _ratio(one(tokens, backend.name, "predicted_cached"), prompt),
        }
        if counts:
            row["prompt_tokens"] = prompt
            row["cached_tokens"] = one(tokens, backend.name, "cached")
        rows.append(row)
    return rows


def slo(samples: Samples) -> list[Panel]:
    """``spillgate_slo_requests_total`` per SLO class: attainment is ``met`` over all finished requests."""
    cells = samples.sum_by("spillgate_slo_requests_total", "slo_class", "result")
    rows = []
    for slo_class in keys(cells):
        row: Panel = {"slo_class": slo_class}
        for result in ("met", "ttft_missed", "tpot_missed"):
            row[result] = one(cells, slo_class, result)
        row["total"] = sum(v for (c, _), v in cells.items() if c == slo_class)
        row["attainment"] = _ratio(row["met"], row["total"])
        rows.append(row)
    return rows


def load(backends: Iterable[Backend]) -> list[Panel]:
    """Live load: the figures ``/metrics`` sets its gauges from at scrape time (in flight is the gateway's
    own count; queue, running batch and KV usage are the replica's, as last scraped)."""
    rows = []
    for backend in backends:
        row: Panel = {
            "backend": backend.name,
            "kind": backend.kind,
            "healthy": backend.healthy,
            "in_flight": backend.own.in_flight,
        }
        if backend.kind == "replica":
            row |= {
                "queued": backend.load.queued,
                "running": backend.load.running,
                "kv_usage": backend.load.token_usage,
                "max_running": backend.max_running,
            }
        rows.append(row)
    return rows


def visible(backends: Iterable[Backend], hidden: Collection[str]) -> list[Backend]:
    return [b for b in backends if b.name not in hidden]
