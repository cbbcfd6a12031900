"""What a tenant may spend and how fast, the refusal a limit produces, and the UTC windows budgets live in.

Money is handled internally in integer nano-dollars so that counters shared through Redis (``HINCRBY``)
add and subtract exactly: floats would drift after millions of reserve/settle pairs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

NANO = 1_000_000_000
"""Nano-dollars per dollar."""

WINDOW_S = 60.0
"""Rate limits are per minute."""


def to_nano(usd: float) -> int:
    return round(usd * NANO)


def to_usd(nano: int | float) -> float:
    return nano / NANO


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's limits; ``None`` means unlimited. Budgets count replica and hosted spend alike,
    the ``hosted_*`` ones only what hosted APIs cost."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    usd_per_day: float | None = None
    usd_per_month: float | None = None
    hosted_usd_per_day: float | None = None
    hosted_usd_per_month: float | None = None
    key_id: str | None = None
    """A managed key's id when ``key_limits`` are its own limits, reserved besides these under that id."""
    key_limits: TenantLimits | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (None: unlimited), not {value}")
        for name in ("usd_per_day", "usd_per_month", "hosted_usd_per_day", "hosted_usd_per_month"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative (None: unlimited), not {value}")

    @property
    def has_budget(self) -> bool:
        budgets = (self.usd_per_day, self.usd_per_month, self.hosted_usd_per_day, self.hosted_usd_per_month)
        return any(b is not None for b in budgets)

    @property
    def unlimited(self) -> bool:
        own = not self.has_budget and self.requests_per_minute is None and self.tokens_per_minute is None
        return own and (self.key_limits is None or self.key_limits.unlimited)


UNLIMITED = TenantLimits()

LimitName = str
"""One of ``requests_per_minute``, ``tokens_per_minute``, ``usd_per_day``, ``usd_per_month``,
``hosted_usd_per_day``, ``hosted_usd_per_month``, or ``accounting_unavailable`` (fail-closed outage)."""


class QuotaExceeded(Exception):
    """A request refused before it was sent: which limit, why, and when trying again can succeed.

    ``retry_after_s`` is ``None`` when waiting cannot help (the request alone is larger than the limit)."""

    def __init__(self, limit: LimitName, message: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.limit = limit
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str | None:
        """The ``Retry-After`` value: whole seconds, at least 1."""
        return None if self.retry_after_s is None else str(max(1, math.ceil(self.retry_after_s)))


# UTC windows ---------------------------------------------------------------------------------------


def utc(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def day_tag(now: float) -> str:
    return _day_tag(int(now // 86_400))


IDS_SLOT_S = 600
"""Counted ledger ids are kept per 10-minute slot of the entry's time, so they expire slot by slot."""


def ids_slot_tag(now: float) -> str:
    """The UTC slot of ``now`` (``YYYYMMDDHHMM`` of its start), for the idempotency set an entry belongs to."""
    return _slot_tag(int(now // IDS_SLOT_S))


@functools.lru_cache(maxsize=64)
def _slot_tag(slot: int) -> str:
    return utc(slot * float(IDS_SLOT_S)).strftime("%Y%m%d%H%M")


@functools.lru_cache(maxsize=64)
def _day_tag(day: int) -> str:
    """Per UTC day number: formatting a date costs microseconds, and every request books one."""
    return utc(day * 86_400.0).strftime("%Y%m%d")


def month_tag(now: float) -> str:
    return utc(now).strftime("%Y%m")


def day_start(now: float) -> float:
    return utc(now).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_start(now: float) -> float:
    return utc(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def next_day_s(now: float) -> float:
    """Seconds until the next UTC midnight: when a daily budget starts over."""
    return day_start(now) + 86_400 - now


def next_month_s(now: float) -> float:
    """Seconds until the first of next month, UTC: when a monthly budget starts over."""
    start = utc(month_start(now))
    following = (start + timedelta(days=32)).replace(day=1)
    return following.timestamp() - now


# Refusals -------------------------------------------------------------------------------------------

_BUDGETS: dict[str, tuple[str, str]] = {
    "usd_per_day": ("daily", "spend"),
    "usd_per_month": ("monthly", "spend"),
    "hosted_usd_per_day": ("daily", "hosted-model spend"),
    "hosted_usd_per_month": ("monthly", "hosted-model spend"),
}


def budget_refusal(limit: LimitName, limits: TenantLimits, worst_case_usd: float, now: float) -> QuotaExceeded:
    """The refusal for a budget: retry when the window starts over, never when one request exceeds it."""
    budget = getattr(limits, limit)
    period, what = _BUDGETS[limit]
    if worst_case_usd > budget:
        return QuotaExceeded(
            limit,
            f"This request may cost up to ${worst_case_usd:.6f}, more than the {period} {what} limit of ${budget:.2f}.",
            None,
        )
    retry = next_day_s(now) if period == "daily" else next_month_s(now)
    return QuotaExceeded(limit, f"The {period} {what} limit of ${budget:.2f} is reached.", retry)


def rate_refusal(limit: LimitName, limits: TenantLimits, cost: int, retry_after_s: float | None) -> QuotaExceeded:
    """The refusal for a per-minute rate limit: retry when the window has freed enough for this request."""
    per_minute = getattr(limits, limit)
    unit = "requests" if limit == "requests_per_minute" else "tokens"
    if retry_after_s is None:
        return QuotaExceeded(limit, f"This request needs {cost} {unit}, more than the limit of {per_minute}/min.", None)
    return QuotaExceeded(limit, f"Rate limit of {per_minute} {unit}/min reached.", retry_after_s)


def worst_refusal(refusals: list[QuotaExceeded]) -> QuotaExceeded:
    """Of several limits that refuse, the one that holds longest: waiting for a shorter one would not help."""
    return max(refusals, key=lambda r: math.inf if r.retry_after_s is None else r.retry_after_s)
