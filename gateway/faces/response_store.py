"""Stored responses, for ``previous_response_id`` and ``GET /v1/responses/{id}``: per tenant, bounded, expiring.

A record is looked up by (tenant, id), so one tenant never reads another's. This module holds the record and the
store of a lone process, in memory; :mod:`.response_store_redis` is the one every gateway process shares.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


class StoreUnavailable(Exception):
    """The shared store cannot be reached: a chained request is answered 503, never 500."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as ``GET`` returns it, and the conversation that continues it: the chat messages its turn sent
    (without the instructions) and the assistant's answer."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]

    def dumps(self) -> bytes:
        return orjson.dumps({"response": self.response, "messages": self.messages})

    @staticmethod
    def loads(data: bytes) -> StoredResponse:
        parsed = orjson.loads(data)
        return StoredResponse(parsed["response"], parsed["messages"])


class ResponseStore(Protocol):
    """Where stored responses live; ``ttl_s`` and ``limit`` are read per call, so a config change applies."""

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def put(self, tenant: str, record: StoredResponse, *, ttl_s: float, limit: int) -> None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...


class MemoryStore:
    """This process's own store: per tenant, oldest first, so both the bound and expiry drop from the front."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._tenants: dict[str, OrderedDict[str, tuple[float, bytes]]] = {}

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        entries = self._tenants.get(tenant)
        entry = entries.get(response_id) if entries is not None else None
        if entry is None:
            return None
        expires, data = entry
        if expires <= self._clock():
            del entries[response_id]  # type: ignore[union-attr]
            return None
        return StoredResponse.loads(data)

    async def put(self, tenant: str, record: StoredResponse, *, ttl_s: float, limit: int) -> None:
        if limit <= 0:
            return
        entries = self._tenants.setdefault(tenant, OrderedDict())
        now = self._clock()
        entries[record.response["id"]] = (now + ttl_s, record.dumps())  # stored as bytes: no aliasing, real size
        entries.move_to_end(record.response["id"])
        while entries and (len(entries) > limit or next(iter(entries.values()))[0] <= now):
            entries.popitem(last=False)

    async def delete(self, tenant: str, response_id: str) -> bool:
        entries = self._tenants.get(tenant)
        return entries is not None and entries.pop(response_id, None) is not None
