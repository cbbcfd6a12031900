"""Single requests on the dashboard, from the durable ledger (``state.spend``): the latest ones, and those
that did not end well per bucket. Both are optional methods of the ledger the dashboard reads
(:class:`~gateway.observability.dashboard.ledger.SpendLedger`): a ledger without them shows the panel as
not available. A tenant's rows are checked again here, so a ledger that ignored the argument leaks nothing."""

from __future__ import annotations

import logging
from typing import Any

from spillgate.gateway.observability.dashboard.ledger import (
    NOT_CONFIGURED,
    call_maybe_async,
    finite,
    first_bucket,
    series_panel,
)

log = logging.getLogger("spillgate.dashboard")

RECENT_ROWS = 25
_TEXT = ("id", "request_id", "tenant", "route", "backend", "kind", "outcome")
_COUNTS = ("prompt_tokens", "cached_tokens", "completion_tokens")


def _recent_row(raw: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {name: str(raw[name]) for name in _TEXT}
    row["time"] = finite(raw["time"])
    row["user"] = None if raw.get("user") is None else str(raw["user"])
    row |= {name: int(raw[name]) for name in _COUNTS}
    row["cost_usd"] = finite(raw["cost_usd"])
    return row


def _failure_row(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "t": finite(raw["t"]),
        "tenant": str(raw["tenant"]),
        "outcome": str(raw["outcome"]),
        "requests": int(raw["requests"]),
    }


async def recent_panel(ledger: object | None, tenant: str | None) -> dict[str, Any]:
    """The latest :data:`RECENT_ROWS` requests, newest first: every tenant's, or ``tenant``'s only."""
    method = getattr(ledger, "recent", None)
    if method is None:
        return {"configured": False, "message": NOT_CONFIGURED}
    try:
        rows = [_recent_row(r) for r in await call_maybe_async(method, tenant, RECENT_ROWS)]
    except Exception as exc:  # the ledger's failure is the panel's, not the whole page's
        log.exception("dashboard: reading the latest requests from the ledger failed")
        return {"configured": True, "error": f"ledger unavailable: {type(exc).__name__}"}
    if tenant is not None:
        rows = [r for r in rows if r["tenant"] == tenant]
    return {"configured": True, "rows": rows[:RECENT_ROWS]}


async def failures_panel(
    ledger: object | None, tenant: str | None, *, window_s: int, bucket_s: int, now: float
) -> dict[str, Any]:
    """Requests whose outcome was not ``ok`` per bucket and outcome over the last ``window_s``, and their
    totals by outcome: what reached a backend and failed there, or was cut off."""
    method = getattr(ledger, "failures", None)
    if method is None:
        return {"configured": False, "message": NOT_CONFIGURED}
    since = first_bucket(now, window_s, bucket_s)
    try:
        rows = [_failure_row(r) for r in await call_maybe_async(method, tenant, bucket_s, since)]
    except Exception as exc:
        log.exception("dashboard: reading failed requests from the ledger failed")
        return {"configured": True, "error": f"ledger unavailable: {type(exc).__name__}"}
    rows = [r for r in rows if r["t"] >= since and (tenant is None or r["tenant"] == tenant)]
    by_outcome: dict[str, int] = {}
    for row in rows:
        by_outcome[row["outcome"]] = by_outcome.get(row["outcome"], 0) + row["requests"]
    return series_panel(rows, since=since, now=now, bucket_s=bucket_s) | {
        "by_outcome": dict(sorted(by_outcome.items())),
        "total": sum(by_outcome.values()),
    }
