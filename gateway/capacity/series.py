"""Sums per fixed-width time bucket over a bounded stretch of the recent past."""

from __future__ import annotations

import math


class BucketSeries:
    """A quantity summed per ``width_s`` bucket over the last ``slots`` buckets.

    A ring indexed by bucket number: memory is ``slots`` numbers however long the gateway runs, and a bucket
    that has fallen out of the ring reads as zero without any pruning pass."""

    __slots__ = ("_latest", "_tags", "_values", "slots", "width_s")

    def __init__(self, width_s: float, slots: int) -> None:
        if width_s <= 0 or slots < 1:
            raise ValueError("a series needs a positive bucket width and at least one slot")
        self.width_s = width_s
        self.slots = slots
        self._values = [0.0] * slots
        self._tags = [-1] * slots
        """The bucket number each slot holds now; any other bucket that maps to the slot reads as zero."""
        self._latest = -1

    def bucket(self, t: float) -> int:
        return math.floor(t / self.width_s)

    def add(self, t: float, value: float = 1.0) -> None:
        """Add ``value`` to the bucket holding time ``t``; a time already out of the ring is dropped (writing it
        would overwrite a newer bucket)."""
        index = self.bucket(t)
        if index <= self._latest - self.slots:
            return
        self._latest = max(self._latest, index)
        slot = index % self.slots
        if self._tags[slot] != index:
            self._tags[slot] = index
            self._values[slot] = 0.0
        self._values[slot] += value

    def recent(self, now: float) -> list[float]:
        """The last ``slots`` buckets up to and including the one holding ``now``, oldest first."""
        end = self.bucket(now)
        tags, values, slots = self._tags, self._values, self.slots
        return [values[i % slots] if tags[i % slots] == i else 0.0 for i in range(end - slots + 1, end + 1)]

    def total(self, now: float) -> float:
        return sum(self.recent(now))
