"""The blocks each replica was sent in the last moments, before its KV-cache events can say it holds them.

A replica publishes a prompt's blocks once its prefill runs; until then, a request sharing the prompt should
still go where the prompt went (and wait for it there, :mod:`gateway.dispatch.coalesce`). This is the
speculative part of an event-fed index, as llm-d inserts what it just routed: entries last ``ttl_s`` seconds,
by when the replica's own events have taken over.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from spillgate.cache.index import known_replicas, leading_depths, lowest_free_bit

DEFAULT_TTL_S = 5.0


class RecentlySent:
    """Blocks sent to each replica within ``ttl_s``; matched like the other indexes."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._holders: dict[int, int] = {}
        self._bits: dict[str, int] = {}
        self._names_by_bit: dict[int, str] = {}
        self._expiry: dict[str, dict[int, float]] = {}
        self._queue: deque[tuple[float, str, Sequence[int]]] = deque()

    def sent(self, replica: str, hashes: Sequence[int]) -> None:
        self._expire()
        bit = self._bits.get(replica)
        if bit is None:
            bit = self._bits[replica] = lowest_free_bit(self._names_by_bit)
            self._names_by_bit[bit] = replica
            self._expiry[replica] = {}
        until = self._clock() + self.ttl_s
        expiry = self._expiry[replica]
        holders = self._holders
        mask = 1 << bit
        for block in hashes:
            expiry[block] = until
            holders[block] = holders.get(block, 0) | mask
        self._queue.append((until, replica, hashes))

    def match(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        self._expire()
        depths, mask = known_replicas(replicas, self._bits)
        return leading_depths(self._holders, hashes, mask, self._names_by_bit, depths)

    def settled(self, replica: str, blocks: Iterable[int]) -> None:
        """The replica's events told about ``blocks`` (stored or removed): they speak for them from now on."""
        bit = self._bits.get(replica)
        if bit is None:
            return
        expiry = self._expiry[replica]
        mask = 1 << bit
        for block in blocks:
            if expiry.pop(block, None) is not None:
                self._release(block, mask)

    def forget(self, replica: str) -> None:
        """The replica restarted or left: what it was sent is gone."""
        bit = self._bits.pop(replica, None)
        if bit is None:
            return
        del self._names_by_bit[bit]
        for block in self._expiry.pop(replica):
            self._release(block, 1 << bit)

    def _expire(self) -> None:
        now = self._clock()
        queue = self._queue
        while queue and queue[0][0] <= now:
            _, replica, hashes = queue.popleft()
            expiry = self._expiry.get(replica)
            if expiry is None:
                continue
            mask = 1 << self._bits[replica]
            for block in hashes:
                until = expiry.get(block)
                if until is not None and until <= now:
                    del expiry[block]
                    self._release(block, mask)

    def _release(self, block: int, mask: int) -> None:
        remaining = self._holders.get(block, 0) & ~mask
        if remaining:
            self._holders[block] = remaining
        else:
            self._holders.pop(block, None)
