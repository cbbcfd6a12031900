"""Spend over time from the durable cost ledger (``state.spend``), which outlives the process and, unlike
the metrics, keeps every tenant apart. The dashboard depends only on this protocol."""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any, Protocol

log = logging.getLogger("spillgate.dashboard")

KINDS = ("replica", "hosted")
NOT_CONFIGURED = "ledger not configured"
PERIODS = frozenset({"day", "month", "year", "all"})


class SpendLedger(Protocol):
    """What the dashboard reads from ``state.spend``. Either method may also be a coroutine function. Two
    more are optional, for the panels of single requests (:mod:`.requests`): ``recent(tenant, limit)`` and
    ``failures(tenant, bucket_s, since_s)``."""

    def series(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
        """Rows ``{"t", "tenant", "kind", "usd", "hosted_equivalent_usd"}``, one per bucket (``t``: epoch
        seconds of its start), tenant and kind, for buckets starting at or after ``since_s`` (epoch
        seconds); ``tenant=None`` means every tenant."""
        ...

    def totals(self, tenant: str | None) -> dict[str, Any]:
        """Running totals; the dashboard shows ``usd`` and ``hosted_equivalent_usd``, labelled with
        ``window`` (``"day"``, ``"month"``, ``"year"`` or ``"all"``) when present."""
        ...


async def call_maybe_async(method: Any, *args: Any) -> Any:
    """``method(*args)``, awaited when it is a coroutine function: a ledger may answer either way."""
    result = method(*args)
    return await result if inspect.isawaitable(result) else result


def finite(value: Any) -> float:
    """``value`` as a float; ``ValueError`` for NaN and infinities, which no ledger figure may be."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def first_bucket(now: float, window_s: int, bucket_s: int) -> float:
    """Where a series over the last ``window_s`` starts: rounded down to a whole bucket, so none is cut short."""
    return math.floor((now - window_s) / bucket_s) * bucket_s


def series_panel(rows: list[dict[str, Any]], *, since: float, now: float, bucket_s: int) -> dict[str, Any]:
    """A panel of rows per bucket (``t``: its start) from ``since`` to ``now``, as the page's charts read it; each
    panel adds its own figures."""
    return {"configured": True, "since": since, "until": now, "bucket_s": bucket_s, "series": rows}


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    kind = str(raw["kind"])
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    return {
        "t": finite(raw["t"]),
        "tenant": str(raw["tenant"]),
        "kind": kind,
        "usd": finite(raw["usd"]),
        # None, not 0, when the ledger does not say: a missing baseline must not read as a loss.
        "hosted_equivalent_usd": finite(raw["hosted_equivalent_usd"]) if "hosted_equivalent_usd" in raw else None,
    }


def _flat_totals(raw: dict[str, Any]) -> dict[str, float]:
    """Only top-level numbers: nested figures (say, per tenant) never reach a tenant's page by accident."""
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _period(raw: dict[str, Any]) -> str | None:
    """What the totals cover, when the ledger names it (``"window": "month"``): a label, never data."""
    period = raw.get("window")
    return period if isinstance(period, str) and period in PERIODS else None


def _window(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Sums over the window by kind; the hosted-only baseline and savings only when every row carries one."""
    usd = sum(r["usd"] for r in rows)
    window: dict[str, float | None] = {f"{k}_usd": sum(r["usd"] for r in rows if r["kind"] == k) for k in KINDS}
    window["usd"] = usd
    baselines = [r["hosted_equivalent_usd"] for r in rows if r["hosted_equivalent_usd"] is not None]
    known = len(baselines) == len(rows)
    window["hosted_equivalent_usd"] = sum(baselines) if known else None
    window["savings_usd"] = sum(baselines) - usd if known else None
    return window


async def spend_panel(
    ledger: SpendLedger | None, tenant: str | None, *, window_s: int, bucket_s: int, now: float
) -> dict[str, Any]:
    """Buckets over the last ``window_s`` and window sums by kind; ``tenant`` restricts rows to that tenant
    (checked again here, so a ledger that ignored the argument still leaks nothing)."""
    if ledger is None:
        return {"configured": False, "message": NOT_CONFIGURED}
    since = first_bucket(now, window_s, bucket_s)
    try:
        rows = [_row(r) for r in await call_maybe_async(ledger.series, tenant, bucket_s, since)]
        raw_totals = await call_maybe_async(ledger.totals, tenant)
        totals, period = _flat_totals(raw_totals), _period(raw_totals)
    except Exception as exc:  # the ledger's failure is the panel's, not the whole page's
        log.exception("dashboard: reading the cost ledger failed")
        return {"configured": True, "error": f"ledger unavailable: {type(exc).__name__}"}
    if tenant is not None:
        rows = [r for r in rows if r["tenant"] == tenant]
    rows = [r for r in rows if r["t"] >= since]
    rows.sort(key=lambda r: (r["t"], r["tenant"], r["kind"]))
    return series_panel(rows, since=since, now=now, bucket_s=bucket_s) | {
        "window": _window(rows),
        "totals": totals,
        "totals_period": period,
        "tenants": sorted({r["tenant"] for r in rows}),
    }
