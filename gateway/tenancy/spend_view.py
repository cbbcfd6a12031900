"""The cost ledger as the dashboard reads it: spend per bucket and kind, this month's totals, the latest
requests, and the failed ones per bucket."""

from __future__ import annotations

import time
from typing import Any

from spillgate.gateway.accounting import Accountant
from spillgate.gateway.accounting.logs import LogQuery


class LedgerSpend:
    """Adapts :class:`~gateway.accounting.Accountant` reads to the dashboard's ``series``/``totals``."""

    def __init__(self, accountant: Accountant) -> None:
        self._accountant = accountant

    async def series(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
        """One row per bucket, tenant and kind since ``since_s``; every tenant when ``tenant`` is None.
        The ledger keeps minutes: ``bucket_s`` is rounded up to whole minutes."""
        bucket_s = max(60, -(-bucket_s // 60) * 60)
        hours = max(bucket_s, time.time() - since_s) / 3600
        names = [tenant] if tenant is not None else sorted(await self._accountant.tenants())
        rows = []
        for name in names:
            for point in await self._accountant.series(name, hours=hours, bucket_s=bucket_s):
                if point.start >= since_s - bucket_s:
                    rows.append({"t": point.start, "tenant": name, "kind": point.kind, "usd": point.usd})
        return rows

    async def totals(self, tenant: str | None) -> dict[str, Any]:
        """This UTC month's spend (all tenants' when ``tenant`` is None), as the ledger has it."""
        reports = [await self._accountant.spend(tenant)] if tenant is not None else await self._accountant.spend_all()
        months = [r.month for r in reports]
        return {
            "window": "month",
            "usd": sum(m.total.usd for m in months),
            "hosted_usd": sum(m.hosted_usd for m in months),
            "hosted_equivalent_usd": sum(m.total.hosted_equivalent_usd for m in months),
            "requests": sum(m.total.requests for m in months),
        }

    async def recent(self, tenant: str | None, limit: int) -> list[dict[str, Any]]:
        """The latest ``limit`` requests, newest first, as ``/admin/spend/logs`` lists them (every tenant's
        when ``tenant`` is None)."""
        page = await self._accountant.ledger.logs(LogQuery(tenant=tenant, limit=limit))
        return page.rows

    async def failures(self, tenant: str | None, bucket_s: int, since_s: float) -> list[dict[str, Any]]:
        """Rows ``{"t", "tenant", "outcome", "requests"}``: requests whose outcome was not ``ok``, per bucket
        (every tenant's when ``tenant`` is None)."""
        found = await self._accountant.ledger.failures(since_s, bucket_s, tenant)
        return [{"t": t, "tenant": name, "outcome": outcome, "requests": n} for t, name, outcome, n in found]
