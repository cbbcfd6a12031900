"""A managed key's own limits, held besides its tenant's: requests and tokens per minute, dollars per day and month.

A request from a key with limits of its own (``TenantLimits.key_limits``) is first charged to the key, then to its
tenant; a refusal by the tenant gives the key's charge back. Requests from other keys never come here, so they pay
nothing for it. Shared through Redis when the quota is (one hash per key, one script call per request), else, and
while Redis is away, counted in this process.

Redis: ``<prefix>:keys:quota:<key id>`` holds ``rpm`` and ``tpm`` (GCRA arrival times in microseconds, as
:mod:`.gcra`) and ``d:<YYYYMMDD>`` / ``m:<YYYYMM>`` (nano-dollars spent plus held). A gateway killed mid-request
leaves that request's hold in its window until the window ends."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

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
from .records import LedgerEntry

_OUTAGE = (RedisError, OSError, RuntimeError)
_TTL_S = 40 * 86_400

_RESERVE = """
local key, now, tokens, usd = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm, per_day, per_month = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local day, month = ARGV[8], ARGV[9]
local window = 60000000
local function charge(name, cost, limit)
  if limit < 0 then return nil, -2 end
  if cost > limit then return nil, -1 end
  local tat = tonumber(redis.call('HGET', key, name) or '0')
  local new = math.max(tat, now) + cost * window / limit
  local wait = new - window - now
  if wait > 1 then return nil, wait end
  return new, -2
end
local function budget(name, limit)
  if limit < 0 then return -2 end
  local committed = tonumber(redis.call('HGET', key, name) or '0')
  if committed + usd > limit then return 0 end
  return -2
end
local rpm_tat, rpm_verdict = charge('rpm', 1, rpm)
local tpm_tat, tpm_verdict = charge('tpm', tokens, tpm)
local verdicts = {rpm_verdict, tpm_verdict, budget(day, per_day), budget(month, per_month)}
for _, v in ipairs(verdicts) do
  if v ~= -2 then return {0, verdicts[1], verdicts[2], verdicts[3], verdicts[4]} end
end
if rpm_tat then redis.call('HSET', key, 'rpm', rpm_tat) end
if tpm_tat then redis.call('HSET', key, 'tpm', tpm_tat) end
if per_day >= 0 then redis.call('HINCRBY', key, day, usd) end
if per_month >= 0 then redis.call('HINCRBY', key, month, usd) end
redis.call('EXPIRE', key, tonumber(ARGV[10]))
return {1}
"""

_SETTLE = """
local key, now, usd = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm_back, tpm_back, rpm, tpm = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local window = 60000000
local function refund(name, amount, limit)
  if limit < 0 or amount == 0 then return end
  local tat = tonumber(redis.call('HGET', key, name) or '0')
  if amount < 0 then
    tat = math.max(tat, now) - amount * window / limit
  else
    tat = math.max(tat - amount * window / limit, now)
  end
  redis.call('HSET', key, name, tat)
end
if usd ~= 0 then
  if ARGV[7] ~= '' then redis.call('HINCRBY', key, ARGV[7], usd) end
  if ARGV[8] ~= '' then redis.call('HINCRBY', key, ARGV[8], usd) end
end
refund('rpm', rpm_back, rpm)
refund('tpm', tpm_back, tpm)
return 1
"""
"""Replace a hold by the real cost (``usd`` is the difference, negative for a release) and give back rate units."""


@dataclass(frozen=True, slots=True)
class KeyHold:
    """What one request charged to its key, to be settled or given back exactly."""

    key_id: str
    limits: TenantLimits
    tokens: int
    usd: int
    day: str
    month: str
    shared: bool


@dataclass
class _KeyState:
    rpm_tat: float = 0.0
    tpm_tat: float = 0.0
    committed: dict[str, int] = field(default_factory=dict)


class KeyQuota:
    """The per-key holds of one quota: in Redis (``client``) or in this process."""

    def __init__(self, client: aioredis.Redis | None = None, prefix: str = "spillgate") -> None:
        self._client = client
        self._prefix = prefix
        self._here: dict[str, _KeyState] = {}
        self._holds: dict[str, KeyHold] = {}
        if client is not None:
            self._reserve = client.register_script(_RESERVE)
            self._settle = client.register_script(_SETTLE)

    async def reserve(
        self, limits: TenantLimits, *, tokens: int, worst_case_usd: float, now: float, shared: bool
    ) -> KeyHold | None:
        """Charge the key of ``limits`` (None: it has no limits of its own); raises :class:`QuotaExceeded`."""
        own = limits.key_limits
        if own is None or limits.key_id is None or own.unlimited:
            return None
        hold = KeyHold(limits.key_id, own, tokens, to_nano(worst_case_usd), day_tag(now), month_tag(now), False)
        if shared and self._client is not None:
            try:
                reply = await self._reserve(keys=[self._key(hold.key_id)], args=self._reserve_args(hold, now))
            except _OUTAGE:
                pass  # counted here until Redis is back
            else:
                if int(reply[0]) == 0:
                    raise _refusal([int(v) for v in reply[1:]], hold, worst_case_usd, now)
                return dataclasses.replace(hold, shared=True)
        self._reserve_here(hold, worst_case_usd, now)
        return hold

    def attach(self, reservation_id: str, hold: KeyHold | None) -> None:
        """``hold`` ends when the tenant's reservation ``reservation_id`` does."""
        if hold is not None:
            self._holds[reservation_id] = hold

    def take(self, reservation_id: str) -> KeyHold | None:
        """The key's hold that ends with this reservation, if any: one dict lookup, for every request."""
        return self._holds.pop(reservation_id, None) if self._holds else None

    async def settle(self, hold: KeyHold, entry: LedgerEntry) -> None:
        """Replace the key's hold by what the request cost, and give back the tokens it did not use."""
        await self._end(hold, to_nano(entry.cost_usd) - hold.usd, 0, hold.tokens - entry.tokens, entry.time)

    async def give_back(self, hold: KeyHold | None, now: float) -> None:
        """The request was refused or never served: everything its key was charged."""
        if hold is not None:
            await self._end(hold, -hold.usd, 1, hold.tokens, now)

    # Where the counters are ---------------------------------------------------------------------------------

    def _key(self, key_id: str) -> str:
        return f"{self._prefix}:keys:quota:{key_id}"

    def _reserve_args(self, hold: KeyHold, now: float) -> list[int | str]:
        limits = hold.limits
        return [
            int(now * 1e6),
            hold.tokens,
            hold.usd,
            _or_none(limits.requests_per_minute),
            _or_none(limits.tokens_per_minute),
            _or_none(limits.usd_per_day, money=True),
            _or_none(limits.usd_per_month, money=True),
            "d:" + hold.day,
            "m:" + hold.month,
            _TTL_S,
        ]

    def _reserve_here(self, hold: KeyHold, worst_case_usd: float, now: float) -> None:
        state = self._here.setdefault(hold.key_id, _KeyState())
        limits, refusals = hold.limits, []
        rpm_tat, tpm_tat = state.rpm_tat, state.tpm_tat
        if limits.requests_per_minute is not None:
            rpm_tat, wait = gcra.charge(rpm_tat, now, 1, limits.requests_per_minute)
            if wait:
                refusals.append(rate_refusal("requests_per_minute", limits, 1, None if wait == gcra.NEVER else wait))
        if limits.tokens_per_minute is not None:
            tpm_tat, wait = gcra.charge(tpm_tat, now, hold.tokens, limits.tokens_per_minute)
            if wait:
                refusal = rate_refusal("tokens_per_minute", limits, hold.tokens, None if wait == gcra.NEVER else wait)
                refusals.append(refusal)
        for name, tag in (("usd_per_day", "d:" + hold.day), ("usd_per_month", "m:" + hold.month)):
            budget = getattr(limits, name)
            if budget is not None and state.committed.get(tag, 0) + hold.usd > to_nano(budget):
                refusals.append(budget_refusal(name, limits, worst_case_usd, now))
        if refusals:
            raise _own(worst_refusal(refusals))
        state.rpm_tat, state.tpm_tat = rpm_tat, tpm_tat
        for tag in ("d:" + hold.day, "m:" + hold.month):
            state.committed[tag] = state.committed.get(tag, 0) + hold.usd

    async def _end(self, hold: KeyHold, usd: int, requests_back: int, tokens_back: int, now: float) -> None:
        limits = hold.limits
        if hold.shared and self._client is not None:
            args: list[int | str] = [
                int(now * 1e6),
                usd,
                requests_back,
                tokens_back,
                _or_none(limits.requests_per_minute),
                _or_none(limits.tokens_per_minute),
                "d:" + hold.day if limits.usd_per_day is not None else "",
                "m:" + hold.month if limits.usd_per_month is not None else "",
            ]
            with contextlib.suppress(*_OUTAGE):  # the key's hold stays in its window: it errs on the limit's side
                await self._settle(keys=[self._key(hold.key_id)], args=args)
            return
        state = self._here.setdefault(hold.key_id, _KeyState())
        for tag in ("d:" + hold.day, "m:" + hold.month):
            state.committed[tag] = state.committed.get(tag, 0) + usd
        if limits.requests_per_minute and requests_back:
            state.rpm_tat = gcra.refund(state.rpm_tat, now, requests_back, limits.requests_per_minute)
        if limits.tokens_per_minute and tokens_back:
            state.tpm_tat = gcra.refund(state.tpm_tat, now, tokens_back, limits.tokens_per_minute)


def _or_none(value: float | int | None, *, money: bool = False) -> int:
    if value is None:
        return -1
    return to_nano(value) if money else int(value)


def _refusal(verdicts: list[int], hold: KeyHold, worst_case_usd: float, now: float) -> QuotaExceeded:
    rpm, tpm, day, month = verdicts
    refusals = []
    if rpm != -2:
        refusals.append(rate_refusal("requests_per_minute", hold.limits, 1, None if rpm == -1 else rpm / 1e6))
    if tpm != -2:
        refusals.append(rate_refusal("tokens_per_minute", hold.limits, hold.tokens, None if tpm == -1 else tpm / 1e6))
    if day != -2:
        refusals.append(budget_refusal("usd_per_day", hold.limits, worst_case_usd, now))
    if month != -2:
        refusals.append(budget_refusal("usd_per_month", hold.limits, worst_case_usd, now))
    return _own(worst_refusal(refusals))


def _own(refused: QuotaExceeded) -> QuotaExceeded:
    """The same refusal, saying it is the key's own limit, not its tenant's."""
    return QuotaExceeded(refused.limit, "This API key's own limit: " + refused.message, refused.retry_after_s)
