"""The quota interface, and its in-process implementation.

:class:`LocalQuota` is the whole of quota enforcement in the embedded mode, and the fallback of
:class:`~.quota_redis.RedisQuota` while Redis is away. Its methods never await, so each runs atomically
on the event loop: no locks, and no state outside the instance (the app owns it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from . import gcra
from .limits import (
    QuotaExceeded,
    TenantLimits,
    budget_refusal,
    day_tag,
    month_tag,
    rate_refusal,
    to_nano,
    worst_refusal,
)
from .quota_keys import KeyQuota
from .records import LedgerEntry, Reservation, new_id
from .report import RateUsage


class Quota(Protocol):
    """Check-and-reserve before a request is sent; replace the hold by the real cost when it ends."""

    @property
    def degraded(self) -> bool: ...

    async def reserve(
        self, tenant: str, limits: TenantLimits, *, tokens: int, worst_case_usd: float, hosted: bool, now: float
    ) -> Reservation:
        """Hold ``worst_case_usd`` and charge one request and ``tokens``, or raise :class:`QuotaExceeded`."""
        ...

    async def settle(self, reservation: Reservation, entry: LedgerEntry) -> bool:
        """Replace the hold by ``entry.cost_usd`` and the token charge by ``entry.tokens``.
        True when the entry is already recorded in the shared store (nothing left to replay)."""
        ...

    async def release(self, reservation: Reservation, entry: LedgerEntry | None, now: float) -> bool:
        """Give everything back (the request was never served); ``entry``, if any, is recorded as is."""
        ...

    async def count(self, entry: LedgerEntry) -> bool:
        """Count an entry that had no reservation; True when the shared store has it."""
        ...


@dataclass
class Window:
    """Counters of one UTC day or month, in nano-dollars; budgets compare ``spent + held``."""

    spent: int = 0
    hosted_spent: int = 0
    held: int = 0
    hosted_held: int = 0
    baseline: int | None = None
    """The shared store's committed total (spent plus held) when this process last saw it; None: never."""
    hosted_baseline: int | None = None


@dataclass
class _TenantState:
    rpm_tat: float = 0.0
    tpm_tat: float = 0.0
    windows: dict[str, Window] = field(default_factory=dict)

    def window(self, tag: str) -> Window:
        found = self.windows.get(tag)
        if found is None:
            found = self.windows[tag] = Window()
            same_kind = sorted(t for t in self.windows if t[0] == tag[0] and t != tag)
            for old in same_kind[:-2]:  # keep a few: a request may settle into the window it was reserved in
                del self.windows[old]
        return found


_RETRY_S = 1.0
_UNSEEN_BUDGET = (
    "Spend accounting is unavailable, and this gateway process has not seen this tenant's shared spend yet, "
    "so requests under a budget are refused until it returns."
)
_BUDGETS = (
    ("usd_per_day", "d", False),
    ("usd_per_month", "m", False),
    ("hosted_usd_per_day", "d", True),
    ("hosted_usd_per_month", "m", True),
)


class LocalQuota:
    """Quota counters in this process: exact for one process, approximate as the fallback of several."""

    degraded = False

    def __init__(self) -> None:
        self._tenants: dict[str, _TenantState] = {}
        self.key_quota = KeyQuota()
        """Managed keys' own limits, held besides their tenants'."""

    def _state(self, tenant: str) -> _TenantState:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _TenantState()
        return state

    # The interface ---------------------------------------------------------------------------------

    async def reserve(
        self, tenant: str, limits: TenantLimits, *, tokens: int, worst_case_usd: float, hosted: bool, now: float
    ) -> Reservation:
        if limits.key_limits is None:
            return self.reserve_now(
                tenant, limits, tokens=tokens, worst_case_usd=worst_case_usd, hosted=hosted, now=now
            )
        hold = await self.key_quota.reserve(limits, tokens=tokens, worst_case_usd=worst_case_usd, now=now, shared=False)
        try:
            reservation = self.reserve_now(
                tenant, limits, tokens=tokens, worst_case_usd=worst_case_usd, hosted=hosted, now=now
            )
        except QuotaExceeded:
            await self.key_quota.give_back(hold, now)
            raise
        self.key_quota.attach(reservation.id, hold)
        return reservation

    async def settle(self, reservation: Reservation, entry: LedgerEntry) -> bool:
        if (key_hold := self.key_quota.take(reservation.id)) is not None:
            await self.key_quota.settle(key_hold, entry)
        state = self._state(reservation.tenant)
        self._unhold(state, reservation)
        self.add_spend(entry)
        if reservation.tokens_per_minute:
            refund = reservation.tokens - entry.tokens
            state.tpm_tat = gcra.refund(state.tpm_tat, entry.time, refund, reservation.tokens_per_minute)
        return False

    async def release(self, reservation: Reservation, entry: LedgerEntry | None, now: float) -> bool:
        if (key_hold := self.key_quota.take(reservation.id)) is not None:
            await self.key_quota.give_back(key_hold, now)
        state = self._state(reservation.tenant)
        self._unhold(state, reservation)
        if entry is not None:
            self.add_spend(entry)
        if reservation.requests_per_minute:
            state.rpm_tat = gcra.refund(state.rpm_tat, now, 1, reservation.requests_per_minute)
        if reservation.tokens_per_minute:
            state.tpm_tat = gcra.refund(state.tpm_tat, now, reservation.tokens, reservation.tokens_per_minute)
        return False

    async def count(self, entry: LedgerEntry) -> bool:
        self.add_spend(entry)
        return False

    def rate_usage(self, tenant: str, limits: TenantLimits, now: float) -> RateUsage:
        state = self._state(tenant)
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        return RateUsage(
            rpm,
            gcra.used(state.rpm_tat, now, rpm) if rpm else None,
            tpm,
            gcra.used(state.tpm_tat, now, tpm) if tpm else None,
        )

    def held(self, tenant: str, now: float) -> tuple[int, int]:
        """Nano-dollars that requests in flight hold today and this month."""
        state = self._state(tenant)
        return state.window("d" + day_tag(now)).held, state.window("m" + month_tag(now)).held

    # Synchronous core ------------------------------------------------------------------------------

    def reserve_now(
        self,
        tenant: str,
        limits: TenantLimits,
        *,
        tokens: int,
        worst_case_usd: float,
        hosted: bool,
        now: float,
        share: float = 1.0,
    ) -> Reservation:
        """Check every limit, then charge them all; refuse with the limit that holds longest.

        ``share`` below 1 (the shared store is away and other processes spend the same budgets): this process
        may spend only that share of what was left of each budget when it last saw the shared totals, so the
        processes together stay within it; a budget whose shared total it never saw is refused."""
        state = self._state(tenant)
        day, month = day_tag(now), month_tag(now)
        windows = {"d": state.window("d" + day), "m": state.window("m" + month)}
        usd = to_nano(worst_case_usd)
        refusals: list[QuotaExceeded] = []
        rpm_tat, tpm_tat = state.rpm_tat, state.tpm_tat
        if limits.requests_per_minute is not None:
            rpm_tat, wait = gcra.charge(rpm_tat, now, 1, limits.requests_per_minute)
            if wait:
                refusals.append(rate_refusal("requests_per_minute", limits, 1, None if wait == gcra.NEVER else wait))
        if limits.tokens_per_minute is not None:
            tpm_tat, wait = gcra.charge(tpm_tat, now, tokens, limits.tokens_per_minute)
            if wait:
                refusals.append(rate_refusal("tokens_per_minute", limits, tokens, None if wait == gcra.NEVER else wait))
        for name, period, hosted_only in _BUDGETS:
            budget = getattr(limits, name)
            if budget is None or (hosted_only and not hosted):
                continue
            window = windows[period]
            committed = window.hosted_spent + window.hosted_held if hosted_only else window.spent + window.held
            allowed = to_nano(budget)
            if share < 1.0:
                baseline = window.hosted_baseline if hosted_only else window.baseline
                if baseline is None:
                    raise QuotaExceeded("accounting_unavailable", _UNSEEN_BUDGET, _RETRY_S)
                allowed = baseline + int(max(0, allowed - baseline) * share)
            if committed + usd > allowed:
                refusals.append(budget_refusal(name, limits, worst_case_usd, now))
        if refusals:
            raise worst_refusal(refusals)
        state.rpm_tat, state.tpm_tat = rpm_tat, tpm_tat
        for window in windows.values():
            window.held += usd
            if hosted:
                window.hosted_held += usd
        return Reservation.made(
            new_id(),
            tenant,
            limits,
            tokens=tokens,
            worst_case_usd=worst_case_usd,
            hosted=hosted,
            at=now,
            day=day,
            month=month,
            shared=False,
        )

    def _unhold(self, state: _TenantState, reservation: Reservation) -> None:
        usd = to_nano(reservation.worst_case_usd)
        for tag in ("d" + reservation.day, "m" + reservation.month):
            window = state.window(tag)
            window.held -= usd
            if reservation.hosted:
                window.hosted_held -= usd

    def add_spend(self, entry: LedgerEntry, sign: int = 1) -> None:
        """Count a finished request's cost in the windows of its time."""
        state = self._state(entry.tenant)
        cost = sign * to_nano(entry.cost_usd)
        for tag in ("d" + day_tag(entry.time), "m" + month_tag(entry.time)):
            window = state.window(tag)
            window.spent += cost
            if entry.kind == "hosted":
                window.hosted_spent += cost

    # Baselines: the ledger at start-up, and Redis while it answers --------------------------------

    def load(self, tenant: str, tag: str, usd_nano: int, hosted_nano: int) -> None:
        """Seed spent totals of a window (``d20250131`` or ``m202501``) from the durable ledger."""
        window = self._state(tenant).window(tag)
        window.spent, window.hosted_spent = usd_nano, hosted_nano

    def adopt(self, tenant: str, tag: str, committed: int, hosted_committed: int) -> None:
        """Take the shared store's view of a window (spent plus held) as this process's baseline."""
        self.load(tenant, tag, committed, hosted_committed)
        window = self._state(tenant).window(tag)
        window.baseline, window.hosted_baseline = committed, hosted_committed

    def adopt_rates(self, tenant: str, rpm_tat: float, tpm_tat: float) -> None:
        state = self._state(tenant)
        state.rpm_tat, state.tpm_tat = rpm_tat, tpm_tat

    def unhold_shared(self, reservation: Reservation) -> None:
        """A Redis-held reservation ends during an outage: its hold is inside the adopted baseline."""
        usd = to_nano(reservation.worst_case_usd)
        state = self._state(reservation.tenant)
        for tag in ("d" + reservation.day, "m" + reservation.month):
            window = state.window(tag)
            window.spent -= usd
            if reservation.hosted:
                window.hosted_spent -= usd
