"""Simulated time, and how it maps onto the wall clock.

The simulator lives in simulated seconds. ``time_scale`` maps them onto the wall clock (0.01 runs
100x faster than real time). Waiting for an absolute simulated instant, rather than sleeping each
step's duration, keeps thousands of sub-millisecond steps accurate in aggregate: timer overshoot
on one step is absorbed by the next.
"""

from __future__ import annotations

import asyncio
import time


class VirtualClock:
    """Converts between simulated seconds (since the clock started) and the monotonic wall clock."""

    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        self._origin = time.monotonic()

    def now(self) -> float:
        """The simulated instant that corresponds to the wall clock right now."""
        return (time.monotonic() - self._origin) / self.time_scale

    async def sleep_until(self, instant: float) -> None:
        """Wait until the wall clock reaches simulated ``instant``; always yields to the event loop."""
        delay = self._origin + instant * self.time_scale - time.monotonic()
        await asyncio.sleep(max(0.0, delay))

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of simulated time."""
        await asyncio.sleep(max(0.0, seconds * self.time_scale))
