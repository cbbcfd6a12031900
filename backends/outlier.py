"""Passive outlier detection: a replica that keeps failing real requests leaves rotation, even while it answers
its liveness probe.

A probe asks "is the process up?"; a replica can say yes and still answer every request with garbage, a
broken stream or nothing at all. So each replica also carries a small circuit breaker fed by the requests
themselves (as Envoy's outlier detection and SGLang Model Gateway's per-worker circuit breaker do):

- ``closed``: in rotation; ``consecutive_failures`` request failures in a row eject it.
- ``ejected``: out of rotation for a backoff period, whatever its probes say. The period doubles with each
  ejection that follows the last within ``max_ejection_s``, up to ``max_ejection_s``.
- ``half_open``: the period is over; the next request it gets is a trial. Success closes the breaker, a failure
  ejects it again at once (for longer); while the trial runs nothing else is sent there.

The state lives on each :class:`~backends.backend.Backend`; the registry is its only writer, told by events
(a request failed, succeeded, was dispatched, was abandoned). The transitions here take the time as an argument
and touch nothing else, so they are tested without a clock or a network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

BreakerState = Literal["closed", "ejected", "half_open"]

TRIAL_RUNNING = math.inf
"""``ejected_until`` while a half-open trial is in flight: no other request may go there until it ends."""


@dataclass(frozen=True, slots=True)
class OutlierRules:
    """The thresholds, from the config's ``outlier`` section."""

    consecutive_failures: int = 5
    base_ejection_s: float = 10.0
    max_ejection_s: float = 300.0
    max_ejected_percent: float = 50.0

    def ejection_s(self, ejections: int) -> float:
        """How long the ``ejections``-th ejection in a row lasts: doubling from the base, capped."""
        return min(self.max_ejection_s, self.base_ejection_s * 2 ** max(0, ejections - 1))

    def may_eject(self, pool_size: int, ejected_in_pool: int) -> bool:
        """Whether one more of a pool's replicas may be out: never more than the allowed share of the pool (so a
        pool of one, where ejecting has nowhere to send its requests, keeps its replica)."""
        return ejected_in_pool + 1 <= math.floor(pool_size * self.max_ejected_percent / 100)


@dataclass(slots=True)
class Breaker:
    """One replica's outlier state. ``ejected_until`` is what routing reads (a ``time.monotonic`` instant)."""

    state: BreakerState = "closed"
    consecutive: int = 0
    """Request failures in a row since the last success."""
    ejections: int = 0
    """Ejections in a row: the backoff's exponent. Reset once the replica has stayed in for ``max_ejection_s``."""
    ejected_until: float = 0.0
    ejected_at: float = -math.inf
    total_ejections: int = 0
    last_failure: str = ""

    def failed(self, rules: OutlierRules, now: float, reason: str, *, may_eject: bool) -> bool:
        """A request failed here; returns whether that ejects the replica (``may_eject``: the pool can spare it)."""
        self.consecutive += 1
        self.last_failure = reason
        if self.state == "ejected":
            return False  # a request sent before the ejection, failing late: already out
        trial_failed = self.state == "half_open"
        if not trial_failed and (self.consecutive < rules.consecutive_failures or not may_eject):
            return False
        if not trial_failed and now - self.ejected_at > rules.max_ejection_s + rules.ejection_s(self.ejections):
            self.ejections = 0  # it had stayed in long enough: start again from the base period
        self.ejections += 1
        self.total_ejections += 1
        self.state = "ejected"
        self.ejected_at = now
        self.ejected_until = now + rules.ejection_s(self.ejections)
        return True

    def succeeded(self) -> None:
        """A request was answered properly here: a half-open trial closes the breaker."""
        self.consecutive = 0
        if self.state != "ejected":
            self.state = "closed"
            self.ejected_until = 0.0

    def dispatched(self, now: float) -> bool:
        """A request is about to go here; returns whether it is a half-open trial (then nothing else may follow
        until it ends)."""
        if self.state == "ejected" and now >= self.ejected_until:
            self.state = "half_open"
        if self.state != "half_open" or self.ejected_until == TRIAL_RUNNING:
            return False
        self.ejected_until = TRIAL_RUNNING
        return True

    def abandoned(self) -> None:
        """A trial ended without a verdict (the client left): the next request is the trial instead."""
        if self.state == "half_open" and self.ejected_until == TRIAL_RUNNING:
            self.ejected_until = 0.0

    def shown(self, now: float) -> BreakerState:
        """The state as of ``now`` (an ejection whose period is over shows as half-open)."""
        if self.state == "ejected" and now >= self.ejected_until:
            return "half_open"
        return self.state
