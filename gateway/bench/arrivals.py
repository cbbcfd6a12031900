"""When open-loop requests are sent: a Poisson process at one rate, or a rate schedule of phases, as offsets.

Kept free of clocks and sleeping so the schedule can be checked exactly; the runner turns offsets into
sleeps, and each request runs as its own task so a slow response never delays the next arrival.

A rate schedule is written ``RATE:SECONDS,RATE:SECONDS,...``: ``RATE`` is requests per second, or ``Nx``
for N times a capacity given separately (``0.6x:60,3x:60,0.6x:60`` is the ``burst`` scenario: steady load
at 60% of capacity, a minute at three times capacity, then steady again). Arrivals within each phase are
Poisson at the phase's rate, so the whole is a Poisson process whose rate steps at the phase boundaries.
"""

from __future__ import annotations

import bisect
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

BURST = "burst"
"""The named scenario ``burst``: see :func:`burst_spec`."""

_ENTRY = re.compile(r"^(?P<rate>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?P<x>x?):(?P<seconds>[0-9]*\.?[0-9]+)$")


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


@dataclass(frozen=True)
class Phase:
    """A stretch of constant-rate Poisson arrivals. ``label`` is the rate as written (``0.6x``, ``12``)."""

    rate: float
    duration_s: float
    label: str = ""


@dataclass(frozen=True)
class RateSchedule:
    """Phases back to back from offset 0; phase ``i`` covers ``[start_i, end_i)`` seconds."""

    phases: tuple[Phase, ...]

    @property
    def duration_s(self) -> float:
        return sum(phase.duration_s for phase in self.phases)

    def bounds(self) -> list[tuple[float, float]]:
        """``(start, end)`` of each phase, in seconds from the start of the run."""
        out, start = [], 0.0
        for phase in self.phases:
            out.append((start, start + phase.duration_s))
            start += phase.duration_s
        return out

    def phase_at(self, offset: float) -> int | None:
        """The index of the phase ``offset`` falls in (a boundary belongs to the phase it starts); ``None``
        before 0 or from the end of the last phase on."""
        bounds = self.bounds()
        if offset < 0 or not bounds or offset >= bounds[-1][1]:
            return None
        return bisect.bisect_right([start for start, _ in bounds], offset) - 1

    def offsets(self, rng: random.Random) -> Iterator[float]:
        """Arrival times over the whole schedule, in order; the iterator ends with the last phase.

        Each phase restarts its exponential clock at its own start, which (memorylessness) is exactly a
        Poisson process whose rate changes at the boundary. Unlike :func:`poisson_offsets`, nothing is
        forced at 0: per-phase counts stay Poisson, which the report's per-phase figures rely on.
        """
        for phase, (start, end) in zip(self.phases, self.bounds(), strict=True):
            if phase.rate <= 0:
                continue
            now = start
            while True:
                now += rng.expovariate(phase.rate)
                if now >= end:
                    break
                yield now

    def describe(self) -> str:
        """``0.6x 2.4/s 60s, 3x 12/s 60s, ...``: each phase's rate as written, as resolved, and its length."""
        parts = []
        for phase in self.phases:
            resolved = f"{phase.rate:.3g}/s"
            written = f"{phase.label} " if phase.label and phase.label.endswith("x") else ""
            parts.append(f"{written}{resolved} {phase.duration_s:g}s")
        return ", ".join(parts)


def burst_spec(burst_s: float = 60.0, steady_s: float = 60.0, steady: float = 0.6, peak: float = 3.0) -> str:
    """The ``burst`` scenario as a schedule: ``steady`` x capacity, ``peak`` x capacity, ``steady`` again."""
    return f"{steady:g}x:{steady_s:g},{peak:g}x:{burst_s:g},{steady:g}x:{steady_s:g}"


def parse_rate_schedule(spec: str, capacity_rps: float | None = None) -> RateSchedule:
    """Parse ``RATE:SECONDS,...`` (``RATE`` in requests/s, or ``Nx`` times ``capacity_rps``).

    Raises ``ValueError`` naming the entry at fault. A phase may have rate 0 (idle), but not every phase.
    """
    entries = [entry.strip() for entry in spec.split(",")]
    if not spec.strip() or any(not entry for entry in entries):
        raise ValueError(f"rate schedule {spec!r}: expected RATE:SECONDS[,RATE:SECONDS...], e.g. 0.6x:60,3x:60")
    phases = []
    for number, entry in enumerate(entries, 1):
        match = _ENTRY.match(entry.replace(" ", ""))
        if match is None:
            raise ValueError(
                f"rate schedule entry {number} {entry!r}: expected RATE:SECONDS (RATE in requests/s, "
                "or Nx for N times --capacity-rps)"
            )
        rate, seconds = float(match["rate"]), float(match["seconds"])
        if seconds <= 0:
            raise ValueError(f"rate schedule entry {number} {entry!r}: a phase must last more than 0 seconds")
        label = match["rate"] + match["x"]
        if match["x"]:
            if capacity_rps is None or capacity_rps <= 0:
                raise ValueError(
                    f"rate schedule entry {number} {entry!r} is relative (Nx): pass a positive --capacity-rps"
                )
            rate *= capacity_rps
        phases.append(Phase(rate=rate, duration_s=seconds, label=label))
    if all(phase.rate <= 0 for phase in phases):
        raise ValueError(f"rate schedule {spec!r}: every phase has rate 0")
    return RateSchedule(tuple(phases))
