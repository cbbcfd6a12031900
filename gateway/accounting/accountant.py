"""The one object the gateway holds: quota, ledger and spend reads, embedded or shared through Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path

import redis.asyncio as aioredis

from .ledger import Ledger
from .limits import UNLIMITED, TenantLimits, day_start, day_tag, month_start, month_tag, to_nano
from .quota import LocalQuota, Quota
from .quota_redis import OUTAGE_ERRORS, RedisQuota
from .rebuild import Epochs
from .records import BackendKind, LedgerEntry, Reservation, new_id
from .report import RateUsage, SeriesPoint, Sums, TenantSpend, window_spend
from .rollup import Rollup
from .shipper import Shipper
from .spend_redis import read_series, read_tenant

log = logging.getLogger("spillgate.accounting")


def _now(now: float | None) -> float:
    return time.time() if now is None else now


class Accountant:
    """Owned by the app: build it, ``await start()``, call it per request, ``await stop()``.

    Without ``redis`` everything is in this process and the ledger file. With it, quotas and rollups are
    shared by every process using the same ``key_prefix``; ``fail_open`` picks what happens to requests
    under a budget while Redis is away (see :mod:`.quota_redis`); settles go to Redis in batches, at most
    ``book_interval_s`` apart. The Redis client stays the caller's to close (after :meth:`stop`); build it
    with :func:`~.quota_redis.make_client`."""

    def __init__(
        self,
        ledger_path: str | Path,
        *,
        redis: aioredis.Redis | None = None,
        key_prefix: str = "spillgate",
        fail_open: bool = True,
        hold_ttl_s: float = 60.0,
        series_hours: float = 24.0,
        retain_days: float = 62.0,
        replay_interval_s: float = 0.5,
        epoch_check_s: float = 2.0,
        book_interval_s: float = 0.02,
    ) -> None:
        self.ledger = Ledger(ledger_path, retain_days=retain_days)
        self.rollup = Rollup(series_hours=series_hours)
        self.local = LocalQuota()
        self.shared: RedisQuota | None = None
        self._shipper: Shipper | None = None
        self.quota: Quota = self.local
        if redis is not None:
            series_ttl_s = int(series_hours * 3600) + 86_400
            self.shared = RedisQuota(
                redis,
                self.local,
                key_prefix=key_prefix,
                fail_open=fail_open,
                hold_ttl_s=hold_ttl_s,
                series_ttl_s=series_ttl_s,
                book_interval_s=book_interval_s,
            )
            self.quota = self.shared
            path = Path(ledger_path)
            epochs = Epochs(self.shared, self.ledger, path.with_name(path.stem + "-epoch.json"))
            self._shipper = Shipper(
                self.shared, self.ledger, epochs, interval_s=replay_interval_s, epoch_interval_s=epoch_check_s
            )
        self._settling: set[asyncio.Task[None]] = set()

    @property
    def degraded(self) -> bool:
        """Redis is unreachable, or has not yet received every ledger entry (never, when embedded)."""
        return self.shared is not None and (self.shared.down or self.ledger.backlog > 0)

    # Life cycle ------------------------------------------------------------------------------------------

    async def start(self, now: float | None = None) -> None:
        """Open the ledger, reload this month's totals from it, and replay what Redis has not had."""
        now = _now(now)
        await self.ledger.start(now)
        since = min(month_start(now), day_start(now) - 86_400)
        for tenant, day, kind, backend, n, prompt, cached, completion, usd, equiv in await self.ledger.groups(since):
            sums = Sums(to_nano(usd), to_nano(equiv), n, prompt, cached, completion)
            self.rollup.add_group(tenant, day, kind, backend, sums)
        for tenant, minute, kind, n, usd in await self.ledger.minutes(now - self.rollup.series_s):
            self.rollup.add_minute(tenant, minute, kind, to_nano(usd), n)
        for tenant in self.rollup.tenants():
            for tag in ("d" + day_tag(now), "m" + month_tag(now)):
                scopes = self.rollup.window(tenant, tag)
                self.local.load(tenant, tag, scopes.get("t", Sums()).usd, scopes.get("k:hosted", Sums()).usd)
        if self._shipper is not None:
            await self._shipper.start()

    async def stop(self) -> None:
        """Finish pending settles, replay what can be, and commit every queued entry to the file."""
        if self.shared is not None:
            self.shared.bookings.stop_waiting()
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
        if self._shipper is not None:
            await self._shipper.stop()
        await self.ledger.stop()

    async def flush(self) -> None:
        """Commit every entry booked so far to the ledger file."""
        await self.ledger.flush()

    # Per request --------------------------------------------------------------------------------------------

    async def reserve(
        self,
        tenant: str,
        limits: TenantLimits,
        *,
        tokens: int,
        worst_case_usd: float,
        hosted: bool,
        now: float | None = None,
    ) -> Reservation:
        """Before sending: charge one request and ``tokens`` (prompt + max_tokens) to the rate limits and hold
        ``worst_case_usd`` against the budgets (the hosted ones too when ``hosted``), atomically.

        Raises :class:`~.limits.QuotaExceeded` (``limit``, ``message``, ``retry_after_s``)."""
        if tokens < 0 or worst_case_usd < 0:
            raise ValueError("tokens and worst_case_usd must not be negative")
        return await self.quota.reserve(
            tenant, limits, tokens=tokens, worst_case_usd=worst_case_usd, hosted=hosted, now=_now(now)
        )

    async def settle(self, reservation: Reservation, entry: LedgerEntry) -> None:
        """The request was served (any outcome): replace the hold by ``entry.cost_usd`` and the token charge
        by ``entry.prompt_tokens + entry.completion_tokens``, and book ``entry`` in the ledger."""
        entry = self._own(reservation, entry)
        shipped = await self.quota.settle(reservation, entry)
        self._book(entry, shipped, reservation)

    async def release(
        self, reservation: Reservation, entry: LedgerEntry | None = None, now: float | None = None
    ) -> None:
        """The request never reached a backend: give back the hold and the rate charges. ``entry`` (say, an
        error outcome at cost 0) is booked if given."""
        owned = self._own(reservation, entry) if entry is not None else None
        shipped = await self.quota.release(reservation, owned, _now(now))
        if owned is not None:
            self._book(owned, shipped, reservation)

    def settle_soon(self, reservation: Reservation, entry: LedgerEntry) -> None:
        """:meth:`settle` from synchronous code (a ``finally`` on the hot path): runs as a task that
        :meth:`stop` waits for, and that a cancelled request cannot interrupt. The entry is journaled first,
        so a process killed before the task ends loses nothing."""
        self.ledger.journal(self._own(reservation, entry), reservation.id if reservation.shared else "")
        self._in_background(self.settle(reservation, entry))

    def release_soon(self, reservation: Reservation, entry: LedgerEntry | None = None) -> None:
        """:meth:`release` from synchronous code, like :meth:`settle_soon`."""
        if entry is not None:
            self.ledger.journal(self._own(reservation, entry), reservation.id if reservation.shared else "")
        else:
            self.ledger.abandoned(reservation.id)
        self._in_background(self.release(reservation, entry))

    def dispatched(
        self,
        reservation: Reservation | None,
        request_id: str,
        tenant: str,
        route: str,
        backend: str,
        kind: BackendKind,
        prompt_tokens: int,
        worst_case_usd: float,
        user: str = "",
    ) -> str:
        """Before a request is sent: it is booked at ``worst_case_usd`` on ``backend`` (outcome
        ``gateway_killed``; through the ledger, then Redis, like any entry) should this process be killed
        before it ends, ``user`` (the client's) kept with it. Returns the id its real entry must carry to
        replace that: the reservation's (settled through it), or a new one to record it with, or to
        :meth:`abandon` should it end without an entry. A few microseconds, and never waits."""
        if reservation is None:
            entry_id, hold_id = new_id(), ""
        else:  # its replay drops the hold, wherever it was made (dropping one Redis never had is harmless)
            entry_id = reservation.id
            hold_id = entry_id if self.shared is not None else ""
        request = (entry_id, request_id, time.time(), tenant, route, backend, kind, prompt_tokens, worst_case_usd)
        self.ledger.opened((*request, hold_id, user))
        return entry_id

    def abandon(self, entry_id: str) -> None:
        """The request :meth:`dispatched` without a reservation ended without an entry."""
        self.ledger.abandoned(entry_id)

    def record_soon(self, entry: LedgerEntry) -> None:
        """:meth:`record` from synchronous code, like :meth:`settle_soon`. Embedded, nothing awaits, so it is
        done at once: no task per request on the hot path."""
        entry = entry.with_id(new_id())
        self.ledger.journal(entry)
        if self.shared is None:
            self.local.add_spend(entry)
            self._book(entry, False, None)
            return
        self._in_background(self._count(entry))

    def _in_background(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._settling.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._settling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("accounting: settling a request failed", exc_info=task.exception())

    async def record(self, entry: LedgerEntry) -> None:
        """Book an entry that had no reservation (its cost still counts against the budgets)."""
        await self._count(entry.with_id(new_id()))

    async def _count(self, entry: LedgerEntry) -> None:
        shipped = await self.quota.count(entry)
        self._book(entry, shipped, None)

    def _own(self, reservation: Reservation, entry: LedgerEntry) -> LedgerEntry:
        if entry.tenant != reservation.tenant:
            raise ValueError(f"entry of tenant {entry.tenant!r} settles a reservation of {reservation.tenant!r}")
        return entry.with_id(reservation.id)

    def _book(self, entry: LedgerEntry, shipped: bool, reservation: Reservation | None) -> None:
        # Any reservation's hold may be in Redis (one reserved here while Redis was away is put back there).
        hold = reservation.id if reservation is not None and self.shared is not None and not shipped else ""
        self.rollup.add(entry)
        self.ledger.append(entry, shipped=shipped, hold_id=hold)

    # Reads ------------------------------------------------------------------------------------------------

    async def spend(self, tenant: str, limits: TenantLimits = UNLIMITED, now: float | None = None) -> TenantSpend:
        """Today's and this month's spend of ``tenant`` (all processes' when shared), and its rate usage."""
        now = _now(now)
        if self.shared is not None and not self.shared.down:
            await self.shared.booked()
            try:
                shared = await read_tenant(self.shared.client, self.shared.keys, tenant, limits, now)
            except OUTAGE_ERRORS as exc:
                self.shared.lost(exc)
            else:
                parts = (shared.day, shared.day_held, shared.month, shared.month_held, shared.rate)
                return self._tenant_spend(tenant, limits, now, *parts)
        day_held, month_held = self.local.held(tenant, now)
        day = self.rollup.window(tenant, "d" + day_tag(now))
        month = self.rollup.window(tenant, "m" + month_tag(now))
        rate = self.local.rate_usage(tenant, limits, now)
        return self._tenant_spend(tenant, limits, now, day, day_held, month, month_held, rate)

    def _tenant_spend(
        self,
        tenant: str,
        limits: TenantLimits,
        now: float,
        day: Mapping[str, Sums],
        day_held: int,
        month: Mapping[str, Sums],
        month_held: int,
        rate: RateUsage,
    ) -> TenantSpend:
        return TenantSpend(
            tenant,
            window_spend("day", day_start(now), day, day_held, limits.usd_per_day, limits.hosted_usd_per_day),
            window_spend(
                "month", month_start(now), month, month_held, limits.usd_per_month, limits.hosted_usd_per_month
            ),
            rate,
            self.degraded,
        )

    async def tenants(self) -> set[str]:
        """Every tenant with ledger entries this process knows of (all processes' when shared)."""
        known = self.rollup.tenants()
        if self.shared is not None and not self.shared.down:
            try:
                members = await self.shared.client.smembers(self.shared.keys.tenants)
                known |= {m.decode() if isinstance(m, bytes) else m for m in members}
            except OUTAGE_ERRORS as exc:
                self.shared.lost(exc)
        return known

    async def spend_all(
        self, limits: Mapping[str, TenantLimits] | None = None, now: float | None = None
    ) -> list[TenantSpend]:
        """``/admin/spend``: every tenant in ``limits`` and every tenant with spend, by name."""
        limits = limits or {}
        names = sorted(set(limits) | await self.tenants())
        return [await self.spend(name, limits.get(name, UNLIMITED), now) for name in names]

    async def series(
        self, tenant: str, *, hours: float = 1.0, bucket_s: int = 60, now: float | None = None
    ) -> list[SeriesPoint]:
        """Spend per ``bucket_s`` bucket and backend kind over the last ``hours``, oldest first, dense."""
        until = _now(now)
        since = until - hours * 3600
        if self.shared is not None and not self.shared.down:
            await self.shared.booked()
            try:
                return await read_series(self.shared.client, self.shared.keys, tenant, since, until, bucket_s)
            except OUTAGE_ERRORS as exc:
                self.shared.lost(exc)
        return self.rollup.series(tenant, since, until, bucket_s)
