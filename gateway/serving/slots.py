"""How many completions the gateway serves at once, counted over both generation endpoints.

A slot is taken only once a request has shown a valid key and its whole body has arrived: a client with no
key, or one that sends its body a byte at a time, never holds one, so neither can starve paying tenants.
The bodies still arriving are bounded apart, in bytes over all connections, since they hold memory before
any slot does.
"""

from __future__ import annotations

from collections.abc import Callable

from spillgate.gateway.errors import error_body

READING_FULL_MESSAGE = (
    "The gateway is receiving as many request bytes as it is configured to (limits.max_reading_body_bytes); "
    "retry shortly."
)
OVERLOADED = error_body(
    503,
    "The gateway is serving as many requests as it is configured to (limits.max_in_flight); retry shortly.",
    code="overloaded",
)


class InFlightLimit:
    """Slots for completions in progress; ``limit`` is read at each take, so a live config edit applies."""

    __slots__ = ("_limit", "in_flight")

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self.in_flight = 0

    def try_take(self) -> bool:
        if self.in_flight >= self._limit():
            return False
        self.in_flight += 1
        return True

    def give_back(self) -> None:
        self.in_flight -= 1


class ReadingBudget:
    """Bytes of request bodies received and not yet whole, over every connection."""

    __slots__ = ("_limit", "reading")

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self.reading = 0

    def take(self, size: int) -> bool:
        if self.reading + size > self._limit():
            return False
        self.reading += size
        return True

    def give_back(self, size: int) -> None:
        self.reading -= size
