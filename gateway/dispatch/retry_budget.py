"""How many fallbacks the gateway may send: a share of recent requests, plus a small floor.

A fallback (a request sent again to another backend after the first failed before the client saw a byte) is
what makes one bad replica invisible to clients. When the whole fleet is sick, though, every request would be
sent twice, doubling the load on backends that are already failing. A retry budget, as Linkerd's and Envoy's,
bounds that: over the last ``window_s``, fallbacks may be at most ``ratio`` of the requests plus
``min_per_s`` per second of the window, so a quiet gateway can still retry its few failures.

Counted in one-second buckets: O(window) memory, O(1) per request.
"""

from __future__ import annotations

import math
import random


class RetryBudget:
    """Requests and retries over a sliding window; :meth:`try_retry` spends from what that allows."""

    __slots__ = ("_buckets", "_min_per_s", "_ratio", "_requests", "_retries", "_window")

    def __init__(self, *, ratio: float = 0.2, min_per_s: float = 1.0, window_s: float = 10.0) -> None:
        self._ratio = ratio
        self._min_per_s = min_per_s
        self._window = max(1, math.ceil(window_s))
        self._buckets: list[int] = [-1] * self._window
        """The second each bucket counts, so a stale one is recognised and cleared on reuse."""
        self._requests = [0] * self._window
        self._retries = [0] * self._window

    def configure(self, *, ratio: float, min_per_s: float, window_s: float) -> None:
        """New limits (a config change); what was counted is forgotten if the window's length changed."""
        self._ratio, self._min_per_s = ratio, min_per_s
        window = max(1, math.ceil(window_s))
        if window != self._window:
            self._window = window
            self._buckets, self._requests, self._retries = [-1] * window, [0] * window, [0] * window

    def request(self, now: float) -> None:
        """A client request arrived (``now``: ``time.monotonic``)."""
        self._requests[self._bucket(now)] += 1

    def try_retry(self, now: float) -> bool:
        """Spend one retry if the window allows it; False means fail now rather than add load."""
        index = self._bucket(now)
        requests, retries = self._totals(now)
        if retries + 1 > requests * self._ratio + self._min_per_s * self._window:
            return False
        self._retries[index] += 1
        return True

    def _bucket(self, now: float) -> int:
        second = int(now)
        index = second % self._window
        if self._buckets[index] != second:
            self._buckets[index] = second
            self._requests[index] = 0
            self._retries[index] = 0
        return index

    def _totals(self, now: float) -> tuple[int, int]:
        oldest = int(now) - self._window
        requests = retries = 0
        for index, second in enumerate(self._buckets):
            if second > oldest:
                requests += self._requests[index]
                retries += self._retries[index]
        return requests, retries


def jittered_backoff(base_s: float, attempt: int) -> float:
    """Seconds to wait before fallback ``attempt`` (1 for the first): "full jitter", uniform up to the base
    doubled per attempt, so that requests failing together do not all come back at the same instant."""
    return random.uniform(0.0, base_s * 2 ** (attempt - 1))
