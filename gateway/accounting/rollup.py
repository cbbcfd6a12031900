"""This process's view of spend: ledger entries added up per tenant, UTC day and month, and minute.

It answers ``/v1/spend`` in the embedded mode (seeded from the ledger file at start, so it survives a
restart) and while Redis is away. The Redis rollup hashes keep the same sums, filled by the same entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .limits import day_tag, month_tag, to_nano, to_usd
from .records import LedgerEntry
from .report import SeriesPoint, Sums

KINDS = ("replica", "hosted")


def entry_sums(entry: LedgerEntry) -> Sums:
    return Sums(
        usd=to_nano(entry.cost_usd),
        equiv=to_nano(entry.hosted_equivalent_usd),
        n=1,
        prompt=entry.prompt_tokens,
        cached=entry.cached_tokens,
        completion=entry.completion_tokens,
    )


def buckets(
    minutes: Iterable[tuple[int, str, int, int]], since: float, until: float, bucket_s: int
) -> list[SeriesPoint]:
    """Per-minute ``(minute, kind, usd_nano, requests)`` summed into dense buckets of ``bucket_s`` seconds
    (a multiple of 60) from ``since`` to ``until``, every kind in every bucket, oldest first."""
    if bucket_s < 60 or bucket_s % 60:
        raise ValueError("bucket_s must be a positive multiple of 60")
    first = math.floor(since / bucket_s) * bucket_s
    count = max(1, math.ceil((until - first) / bucket_s))
    usd = {(i, k): 0 for i in range(count) for k in KINDS}
    requests = dict.fromkeys(usd, 0)
    for minute, kind, nano, n in minutes:
        index = (minute * 60 - first) // bucket_s
        if 0 <= index < count and kind in KINDS:
            usd[index, kind] += nano
            requests[index, kind] += n
    return [
        SeriesPoint(first + i * bucket_s, kind, to_usd(usd[i, kind]), requests[i, kind])
        for i in range(count)
        for kind in KINDS
    ]


class Rollup:
    def __init__(self, *, series_hours: float = 24.0) -> None:
        self.series_s = series_hours * 3600
        self._windows: dict[tuple[str, str], dict[str, Sums]] = {}
        self._minutes: dict[tuple[str, int, str], list[int]] = {}
        self._last_prune = 0

    def add(self, entry: LedgerEntry) -> None:
        sums, minute = entry_sums(entry), int(entry.time // 60)
        self.add_group(entry.tenant, day_tag(entry.time), entry.kind, entry.backend, sums)
        self.add_minute(entry.tenant, minute, entry.kind, sums.usd, 1)
        if minute != self._last_prune:
            self._last_prune = minute
            self.prune(entry.time)

    def add_group(self, tenant: str, day: str, kind: str, backend: str, sums: Sums) -> None:
        """Count ``sums`` of one day, kind and backend (an entry, or a group of them from the ledger)."""
        for tag in ("d" + day, "m" + day[:6]):
            scopes = self._windows.setdefault((tenant, tag), {})
            for scope in ("t", "k:" + kind, "b:" + backend):
                scopes.setdefault(scope, Sums()).add(sums)

    def add_minute(self, tenant: str, minute: int, kind: str, usd_nano: int, requests: int) -> None:
        counts = self._minutes.setdefault((tenant, minute, kind), [0, 0])
        counts[0] += usd_nano
        counts[1] += requests

    def window(self, tenant: str, tag: str) -> Mapping[str, Sums]:
        """Sums by scope (``t``, ``k:<kind>``, ``b:<backend>``) of ``d<YYYYMMDD>`` or ``m<YYYYMM>``."""
        return self._windows.get((tenant, tag), {})

    def tenants(self) -> set[str]:
        return {tenant for tenant, _ in self._windows}

    def series(self, tenant: str, since: float, until: float, bucket_s: int) -> list[SeriesPoint]:
        rows = ((minute, kind, usd, n) for (t, minute, kind), (usd, n) in self._minutes.items() if t == tenant)
        return buckets(rows, since, until, bucket_s)

    def prune(self, now: float) -> None:
        """Forget days before yesterday, months before last, and minutes older than the series span."""
        oldest_day, oldest_month = "d" + day_tag(now - 86_400), "m" + month_tag(now - 32 * 86_400)
        for window in [k for k in self._windows if k[1] < (oldest_day if k[1][0] == "d" else oldest_month)]:
            del self._windows[window]
        oldest_minute = (now - self.series_s) // 60
        for minute in [k for k in self._minutes if k[1] < oldest_minute]:
            del self._minutes[minute]
