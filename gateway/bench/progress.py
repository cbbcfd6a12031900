"""A one-line progress bar on stderr, redrawn in place; no dependency, and silent when not wanted."""

from __future__ import annotations

from typing import TextIO

from spillgate.gateway.bench.runner import Counters

_WIDTH = 24


class Progress:
    """Draws ``label [####----] done/total  ok  err  in flight  elapsed`` for the level being run.

    The fraction is by requests when the level has a request count, else by time when it has a duration.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._label = ""
        self._total: int | None = None
        self._duration: float | None = None
        self._drawn = False

    def start(self, label: str, *, total: int | None, duration_s: float | None) -> None:
        self._label, self._total, self._duration = label, total, duration_s

    def tick(self, counters: Counters, elapsed: float) -> None:
        finished = counters.completed + counters.failed
        fractions = []
        if self._total:
            fractions.append(finished / self._total)
        if self._duration:
            fractions.append(elapsed / self._duration)
        fraction = min(max(fractions, default=0.0), 1.0)
        filled = int(fraction * _WIDTH)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        total = f"/{self._total}" if self._total else ""
        line = (
            f"\r{self._label} [{bar}] {finished}{total} done  {counters.failed} err  "
            f"{counters.in_flight} in flight  {elapsed:6.1f}s"
        )
        self._stream.write(line + "\x1b[K")  # clear what a longer previous line left
        self._stream.flush()
        self._drawn = True

    def finish(self) -> None:
        """End the line so what follows starts on its own."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False
