"""When open-loop requests are sent: a Poisson process at a given rate, as offsets from the start.

Kept free of clocks and sleeping so the schedule can be checked exactly; the runner turns offsets into
sleeps, and each request runs as its own task so a slow response never delays the next arrival.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def poisson_offsets(rate: float, rng: random.Random) -> Iterator[float]:
    """Endless arrival times (seconds from the start) of a Poisson process with ``rate`` arrivals per second.

    The first request goes at 0 so short runs do not start idle; the gaps after it are exponential.
    """
    if rate <= 0:
        raise ValueError("rate must be positive")
    now = 0.0
    while True:
        yield now
        now += rng.expovariate(rate)
