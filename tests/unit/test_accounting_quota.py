"""In-process quota: GCRA rate limits, UTC budgets, settle/release and the retry_after each refusal gives."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from spillgate.gateway.accounting import LedgerEntry, LocalQuota, QuotaExceeded, Reservation, TenantLimits
from spillgate.gateway.accounting.limits import next_day_s, next_month_s
from spillgate.gateway.accounting.records import BackendKind

NOON = datetime(2025, 3, 14, 12, 0, tzinfo=UTC).timestamp()
"""43,200 s to the next UTC day; 17.5 days to the next month."""


def entry(
    *, cost: float = 0.0, prompt: int = 0, completion: int = 0, at: float = NOON, kind: BackendKind = "replica"
) -> LedgerEntry:
    return LedgerEntry("req", at, "t", "route", "b0", kind, prompt, 0, completion, cost, 0.0, "ok")


async def reserve(
    quota: LocalQuota,
    limits: TenantLimits,
    *,
    tokens: int = 0,
    usd: float = 0.0,
    hosted: bool = False,
    now: float = NOON,
) -> Reservation:
    return await quota.reserve("t", limits, tokens=tokens, worst_case_usd=usd, hosted=hosted, now=now)


async def refusal(quota: LocalQuota, limits: TenantLimits, **kwargs: Any) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as refused:
        await reserve(quota, limits, **kwargs)
    return refused.value


def test_windows_end_at_utc_midnight_and_the_first_of_the_month() -> None:
    assert next_day_s(NOON) == 43_200
    assert next_month_s(NOON) == 17.5 * 86_400
    new_year_eve = datetime(2025, 12, 31, 23, 0, tzinfo=UTC).timestamp()
    assert next_day_s(new_year_eve) == next_month_s(new_year_eve) == 3600


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="requests_per_minute"):
        TenantLimits(requests_per_minute=0)
    with pytest.raises(ValueError, match="usd_per_day"):
        TenantLimits(usd_per_day=-1)
    assert TenantLimits().unlimited and not TenantLimits(usd_per_month=5).unlimited


async def test_requests_per_minute_admits_a_minute_then_spaces_requests() -> None:
    quota, limits = LocalQuota(), TenantLimits(requests_per_minute=3)
    for _ in range(3):
        await reserve(quota, limits)
    refused = await refusal(quota, limits)
    assert refused.limit == "requests_per_minute"
    assert refused.retry_after_s == pytest.approx(20.0)  # one request every 60/3 s
    assert refused.retry_after_header == "20"
    await reserve(quota, limits, now=NOON + 20)
    assert (await refusal(quota, limits, now=NOON + 20)).retry_after_s == pytest.approx(20.0)


async def test_tokens_are_reserved_at_worst_and_settled_to_what_was_used() -> None:
    quota, limits = LocalQuota(), TenantLimits(tokens_per_minute=1000)
    first = await reserve(quota, limits, tokens=600)
    refused = await refusal(quota, limits, tokens=600)
    assert refused.limit == "tokens_per_minute"
    assert refused.retry_after_s == pytest.approx(12.0)  # 200 tokens short at 1000/60 per second
    await quota.settle(first, entry(prompt=50, completion=50))  # 500 of the 600 come back
    await reserve(quota, limits, tokens=600)
    assert quota.rate_usage("t", limits, NOON).tokens_used == pytest.approx(700)


async def test_a_request_larger_than_a_limit_is_told_waiting_will_not_help() -> None:
    quota = LocalQuota()
    refused = await refusal(quota, TenantLimits(tokens_per_minute=100), tokens=101)
    assert refused.retry_after_s is None and refused.retry_after_header is None
    refused = await refusal(quota, TenantLimits(usd_per_day=1.0), usd=1.5)
    assert (refused.limit, refused.retry_after_s) == ("usd_per_day", None)


async def test_daily_budget_holds_worst_case_until_settled() -> None:
    quota, limits = LocalQuota(), TenantLimits(usd_per_day=1.0)
    first = await reserve(quota, limits, usd=0.6)
    refused = await refusal(quota, limits, usd=0.6)
    assert refused.limit == "usd_per_day"
    assert refused.retry_after_s == 43_200
    assert "daily spend limit of $1.00" in refused.message
    await quota.settle(first, entry(cost=0.1))
    second = await reserve(quota, limits, usd=0.6)  # 0.1 spent + 0.6 held
    assert (await refusal(quota, limits, usd=0.4)).limit == "usd_per_day"
    await quota.release(second, None, NOON)
    await reserve(quota, limits, usd=0.9)
    assert quota.held("t", NOON) == (900_000_000, 900_000_000)


async def test_concurrent_reservations_never_pass_the_budget() -> None:
    quota, limits = LocalQuota(), TenantLimits(usd_per_day=1.0, requests_per_minute=150)
    costs = [0.01 + (i % 5) / 100 for i in range(200)]

    async def attempt(cost: float) -> float:
        try:
            await reserve(quota, limits, usd=cost)
        except QuotaExceeded:
            return 0.0
        return cost

    admitted = await asyncio.gather(*(attempt(cost) for cost in costs))
    assert 1.0 - 0.05 < sum(admitted) <= 1.0 + 1e-9  # float sum of exact nano-dollar holds


async def test_the_limit_that_holds_longest_is_the_one_reported() -> None:
    quota, limits = LocalQuota(), TenantLimits(requests_per_minute=1, usd_per_day=1.0, usd_per_month=1.0)
    await reserve(quota, limits, usd=1.0)
    refused = await refusal(quota, limits, usd=0.5)
    assert refused.limit == "usd_per_month"
    assert refused.retry_after_s == next_month_s(NOON)


async def test_hosted_budgets_count_only_hosted_spend() -> None:
    quota, limits = LocalQuota(), TenantLimits(hosted_usd_per_day=0.5)
    await reserve(quota, limits, usd=2.0)  # a replica request: not under the hosted budget
    assert (await refusal(quota, limits, usd=0.6, hosted=True)).retry_after_s is None
    hosted = await reserve(quota, limits, usd=0.3, hosted=True)
    assert (await refusal(quota, limits, usd=0.3, hosted=True)).limit == "hosted_usd_per_day"
    # Reserved for a hosted candidate but served by a replica: the hosted hold goes, nothing hosted is spent.
    await quota.settle(hosted, entry(cost=0.2, kind="replica"))
    await reserve(quota, limits, usd=0.5, hosted=True)


async def test_release_gives_back_the_request_and_its_tokens() -> None:
    quota, limits = LocalQuota(), TenantLimits(requests_per_minute=1, tokens_per_minute=100)
    reservation = await reserve(quota, limits, tokens=100)
    await quota.release(reservation, None, NOON)
    await reserve(quota, limits, tokens=100)
    assert (await refusal(quota, limits, tokens=1)).limit == "requests_per_minute"


async def test_a_request_settled_after_midnight_frees_yesterday_and_spends_today() -> None:
    quota, limits = LocalQuota(), TenantLimits(usd_per_day=1.0)
    late = NOON + 43_199
    reservation = await reserve(quota, limits, usd=1.0, now=late)
    await quota.settle(reservation, entry(cost=0.25, at=late + 2))
    assert quota.held("t", late) == (0, 0)
    await reserve(quota, limits, usd=1.0, now=late)  # yesterday is free again
    await reserve(quota, limits, usd=0.75, now=late + 2)
    assert (await refusal(quota, limits, usd=0.01, now=late + 2)).retry_after_s == 86_400 - 1  # 00:00:01
