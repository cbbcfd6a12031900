"""What the read API returns for ``/v1/spend`` and ``/admin/spend``: plain frozen records with ``to_dict``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .limits import to_usd

SUM_FIELDS = ("usd", "equiv", "n", "prompt", "cached", "completion")
"""The counters kept per scope; the same names are the Redis hash fields' suffixes."""


@dataclass(slots=True)
class Sums:
    """Mutable counters (money in nano-dollars) that rollups add entries into."""

    usd: int = 0
    equiv: int = 0
    n: int = 0
    prompt: int = 0
    cached: int = 0
    completion: int = 0

    def add(self, other: Sums) -> None:
        # Spelled out: this runs six times per request on the hot path.
        self.usd += other.usd
        self.equiv += other.equiv
        self.n += other.n
        self.prompt += other.prompt
        self.cached += other.cached
        self.completion += other.completion

    def totals(self) -> Totals:
        return Totals(to_usd(self.usd), to_usd(self.equiv), self.n, self.prompt, self.cached, self.completion)


@dataclass(frozen=True)
class Totals:
    usd: float = 0.0
    hosted_equivalent_usd: float = 0.0
    """What the same tokens would have cost on the route's reference hosted model."""
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def savings_usd(self) -> float:
        return self.hosted_equivalent_usd - self.usd

    def to_dict(self) -> dict[str, Any]:
        return {
            "usd": self.usd,
            "hosted_equivalent_usd": self.hosted_equivalent_usd,
            "savings_usd": self.savings_usd,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass(frozen=True)
class WindowSpend:
    """One UTC day or month of a tenant: settled spend, in total and by backend kind and backend."""

    window: str
    """``"day"`` or ``"month"``."""
    start: float
    total: Totals = field(default_factory=Totals)
    by_kind: Mapping[str, Totals] = field(default_factory=dict)
    by_backend: Mapping[str, Totals] = field(default_factory=dict)
    held_usd: float = 0.0
    """Reserved by requests still in flight (their worst case), not yet spent."""
    limit_usd: float | None = None
    hosted_limit_usd: float | None = None

    @property
    def hosted_usd(self) -> float:
        hosted = self.by_kind.get("hosted")
        return hosted.usd if hosted else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "start": self.start,
            **self.total.to_dict(),
            "hosted_usd": self.hosted_usd,
            "held_usd": self.held_usd,
            "limit_usd": self.limit_usd,
            "hosted_limit_usd": self.hosted_limit_usd,
            "by_kind": {k: t.to_dict() for k, t in sorted(self.by_kind.items())},
            "by_backend": {b: t.to_dict() for b, t in sorted(self.by_backend.items())},
        }


@dataclass(frozen=True)
class RateUsage:
    """How much of each per-minute limit is in use now (``None`` where the tenant has no such limit)."""

    requests_per_minute: int | None = None
    requests_used: float | None = None
    tokens_per_minute: int | None = None
    tokens_used: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests_per_minute": self.requests_per_minute,
            "requests_used": self.requests_used,
            "tokens_per_minute": self.tokens_per_minute,
            "tokens_used": self.tokens_used,
        }


@dataclass(frozen=True)
class TenantSpend:
    tenant: str
    today: WindowSpend
    month: WindowSpend
    rate: RateUsage
    degraded: bool
    """True when Redis is unreachable or has not yet received every entry: the figures are this process's."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "degraded": self.degraded,
            "today": self.today.to_dict(),
            "month": self.month.to_dict(),
            "rate": self.rate.to_dict(),
        }


@dataclass(frozen=True)
class SeriesPoint:
    """Spend of one tenant and backend kind in one bucket starting at ``start`` (epoch seconds)."""

    start: float
    kind: str
    usd: float
    requests: int

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "kind": self.kind, "usd": self.usd, "requests": self.requests}


def sums_of(prompt: int, cached: int, completion: int, usd_nano: int, equiv_nano: int, n: int = 1) -> Sums:
    return Sums(usd=usd_nano, equiv=equiv_nano, n=n, prompt=prompt, cached=cached, completion=completion)


def window_spend(
    window: str,
    start: float,
    scopes: Mapping[str, Sums],
    held_nano: int,
    limit_usd: float | None,
    hosted_limit_usd: float | None,
) -> WindowSpend:
    """Build a window from counters keyed by scope: ``t`` (total), ``k:<kind>``, ``b:<backend>``."""
    total = scopes.get("t", Sums()).totals()
    by_kind = {s[2:]: v.totals() for s, v in scopes.items() if s.startswith("k:")}
    by_backend = {s[2:]: v.totals() for s, v in scopes.items() if s.startswith("b:")}
    return WindowSpend(window, start, total, by_kind, by_backend, to_usd(held_nano), limit_usd, hosted_limit_usd)
