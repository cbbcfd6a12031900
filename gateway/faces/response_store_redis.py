"""Stored responses in Redis, so every gateway process sees them (``state.redis_url``, under ``key_prefix``).

Each record is one string key that expires by itself (``{prefix}:responses:{tenant}:{id}``); a sorted set per
tenant (``{prefix}:responses:{tenant}``, scored by when each was stored) bounds how many a tenant keeps. Storing,
trimming expired entries from the set and dropping the oldest past the bound is one script, so processes storing
at once never leave the set and the records out of step.
"""

from __future__ import annotations

import re
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from spillgate.gateway.faces.response_store import StoredResponse, StoreUnavailable

_PUT = """
local index, id, value = KEYS[1], ARGV[1], ARGV[2]
local ttl_ms, now_ms, limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local prefix = index .. ':'
redis.call('SET', prefix .. id, value, 'PX', ttl_ms)
redis.call('ZADD', index, now_ms, id)
redis.call('ZREMRANGEBYSCORE', index, '-inf', now_ms - ttl_ms)
local over = redis.call('ZCARD', index) - limit
if over > 0 then
  local oldest = redis.call('ZRANGE', index, 0, over - 1)
  for _, old in ipairs(oldest) do
    redis.call('DEL', prefix .. old)
    redis.call('ZREM', index, old)
  end
end
redis.call('PEXPIRE', index, ttl_ms)
return over
"""

_OWN_ID = re.compile(r"resp_[A-Za-z0-9]+")
"""The shape of the ids this gateway gives responses (``resp_`` and hex digits). Any other id is never stored, and
is never made a key: tenant names may hold colons, so ``b:resp_...`` asked for by tenant ``team`` would otherwise
name tenant ``team:b``'s record, and ``b`` its index."""

_OUTAGE = (RedisError, OSError, RuntimeError)
"""What a Redis call raises while Redis is away (as :mod:`gateway.accounting.quota_redis` counts it)."""


class RedisStore:
    """The shared store over one Redis client."""

    def __init__(self, client: aioredis.Redis, key_prefix: str) -> None:
        self._client = client
        self._prefix = f"{key_prefix}:responses"
        self._put = client.register_script(_PUT)

    def _index(self, tenant: str) -> str:
        return f"{self._prefix}:{tenant}"

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        if not _OWN_ID.fullmatch(response_id):
            return None
        try:
            data = await self._client.get(f"{self._index(tenant)}:{response_id}")
        except _OUTAGE as exc:
            raise StoreUnavailable(str(exc)) from None
        return StoredResponse.loads(data) if data is not None else None

    async def put(self, tenant: str, record: StoredResponse, *, ttl_s: float, limit: int) -> None:
        if limit <= 0:
            return
        args = [record.response["id"], record.dumps(), max(1, int(ttl_s * 1000)), int(time.time() * 1000), limit]
        try:
            await self._put(keys=[self._index(tenant)], args=args)
        except _OUTAGE as exc:
            raise StoreUnavailable(str(exc)) from None

    async def delete(self, tenant: str, response_id: str) -> bool:
        if not _OWN_ID.fullmatch(response_id):
            return False
        index = self._index(tenant)
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(f"{index}:{response_id}")
                pipe.zrem(index, response_id)
                deleted, _ = await pipe.execute()
        except _OUTAGE as exc:
            raise StoreUnavailable(str(exc)) from None
        return bool(deleted)
