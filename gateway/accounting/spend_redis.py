"""Reading the shared rollups back from Redis for ``/v1/spend`` and ``/admin/spend``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis

from . import gcra
from .limits import TenantLimits, day_start, day_tag, month_tag
from .redis_keys import RedisKeys
from .report import SUM_FIELDS, RateUsage, SeriesPoint, Sums
from .rollup import buckets


@dataclass(frozen=True)
class SharedTenant:
    day: Mapping[str, Sums]
    day_held: int
    month: Mapping[str, Sums]
    month_held: int
    rate: RateUsage


def parse_rollup(fields: Mapping[bytes, bytes]) -> tuple[dict[str, Sums], int]:
    """``{b"t.usd": b"12", b"k:hosted.n": b"3", b"held": b"5", ...}`` into sums by scope, and the held total."""
    scopes: dict[str, Sums] = {}
    held = 0
    for raw, value in fields.items():
        name = raw.decode()
        if name == "held":
            held = int(value)
            continue
        scope, _, counter = name.rpartition(".")
        if scope and counter in SUM_FIELDS:
            sums = scopes.setdefault(scope, Sums())
            setattr(sums, counter, getattr(sums, counter) + int(value))
    return scopes, held


def _tat(value: bytes | None) -> float:
    return float(value) / 1e6 if value else 0.0


async def read_tenant(
    client: aioredis.Redis, keys: RedisKeys, tenant: str, limits: TenantLimits, now: float
) -> SharedTenant:
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.day(tenant, day_tag(now)))
        pipe.hgetall(keys.month(tenant, month_tag(now)))
        pipe.hmget(keys.rate(tenant), "rpm", "tpm")
        day_fields, month_fields, (rpm_tat, tpm_tat) = await pipe.execute()
    day, day_held = parse_rollup(day_fields)
    month, month_held = parse_rollup(month_fields)
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    rate = RateUsage(
        rpm,
        gcra.used(_tat(rpm_tat), now, rpm) if rpm else None,
        tpm,
        gcra.used(_tat(tpm_tat), now, tpm) if tpm else None,
    )
    return SharedTenant(day, day_held, month, month_held, rate)


async def read_series(
    client: aioredis.Redis, keys: RedisKeys, tenant: str, since: float, until: float, bucket_s: int
) -> list[SeriesPoint]:
    """Per-minute series hashes of the UTC days that ``since..until`` spans, summed into buckets."""
    days: list[float] = []
    start = day_start(since)
    while start < until:
        days.append(start)
        start += 86_400
    async with client.pipeline(transaction=False) as pipe:
        for start in days:
            pipe.hgetall(keys.series(tenant, day_tag(start)))
        replies = await pipe.execute()
    usd: dict[tuple[int, str], int] = {}
    requests: dict[tuple[int, str], int] = {}
    for start, fields in zip(days, replies, strict=True):
        for raw, value in fields.items():
            bucket, _, counter = raw.decode().rpartition(".")
            minute_of_day, _, kind = bucket.partition(":")
            key = (int(start // 60) + int(minute_of_day), kind)
            (usd if counter == "usd" else requests)[key] = int(value)
    rows = ((minute, kind, nano, requests.get((minute, kind), 0)) for (minute, kind), nano in usd.items())
    return buckets(rows, since, until, bucket_s)
