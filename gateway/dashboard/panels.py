"""One function per dashboard panel, each a pure function of a registry read (and the backends' live
state for load), so every figure is the one a PromQL query over ``/metrics`` would give."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from backends.registry import Backend
from gateway.dashboard.quantile import histogram_quantile
from gateway.dashboard.samples import Samples, keys, one

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


def spend(samples: Samples) -> Panel:
    """``spillgate_spend_usd_total`` summed by kind, by tenant label and by route."""
    name = "spillgate_spend_usd_total"
    return {
        "total_usd": sum(samples.sum_by(name).values()),
        "by_kind": {k: v for (k,), v in samples.sum_by(name, "kind").items()},
        "by_tenant": {t: v for (t,), v in samples.sum_by(name, "tenant").items()},
        "by_route": {r: v for (r,), v in samples.sum_by(name, "route").items()},
    }


def savings(samples: Samples) -> Panel:
    """Per route: what sending it all to the route's hosted model would have cost, minus what it cost.
    A route without a hosted target books its own cost as its baseline, so it shows no savings and no
    loss, as in the ledger."""
    equivalent = samples.sum_by("spillgate_hosted_equivalent_usd_total", "route")
    spent = samples.sum_by("spillgate_spend_usd_total", "route")
    rows = [
        {
            "route": route,
            "hosted_equivalent_usd": baseline,
            "spend_usd": one(spent, route),
            "savings_usd": baseline - one(spent, route),
        }
        for (route,), baseline in sorted(equivalent.items())
    ]
    baseline_total = sum(r["hosted_equivalent_usd"] for r in rows)
    spend_total = sum(r["spend_usd"] for r in rows)
    return {
        "routes": rows,
        "hosted_equivalent_usd": baseline_total,
        "spend_usd": spend_total,
        "savings_usd": baseline_total - spend_total,
        "savings_ratio": _ratio(baseline_total - spend_total, baseline_total),
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
            "in_flight": backend.in_flight,
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
