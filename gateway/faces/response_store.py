"""Stored responses, for ``previous_response_id`` and ``GET /v1/responses/{id}``: per tenant, bounded, expiring.

A record is looked up by (tenant, id), so one tenant never reads another's. This module holds the record and what a
store does; :mod:`.response_store_file` keeps them in the data directory, :mod:`.response_store_redis` in the Redis
every gateway process shares.
"""

from __future__ import annotations

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
