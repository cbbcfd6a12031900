"""The background loop that samples replica load into the capacity recorder."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from spillgate.backends.backend import Backend
from spillgate.gateway.capacity.recorder import CapacityRecorder

log = logging.getLogger("spillgate.capacity")


async def sample_forever(
    recorder: CapacityRecorder, backends: Iterable[Backend], interval_s: Callable[[], float]
) -> None:
    """Sample every ``interval_s()`` seconds (the health interval: replica loads change no faster than they are
    scraped) until cancelled; "sustained" pressure means every sample over ``sustain_s`` showed it."""
    while True:
        try:
            recorder.sample(backends, time.perf_counter())
        except Exception:  # a bug here must not stop the sampling for good
            log.exception("capacity sample failed")
        await asyncio.sleep(interval_s())
