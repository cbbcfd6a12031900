"""The values a routing decision is made from and the decision itself: plain, immutable data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BackendKind = Literal["replica", "hosted"]


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the policy may know about one request; built by the gateway before routing."""

    tenant: str
    route: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    sequence: int = 0
    """A per-route counter the gateway assigns, so rotating policies stay pure functions."""


@dataclass(frozen=True, slots=True)
class BackendState:
    """One candidate backend as last observed: scraped figures plus the gateway's own in-flight count."""

    name: str
    kind: BackendKind
    healthy: bool = True
    in_flight: int = 0
    running: int = 0
    queued: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    max_total_tokens: int = 0

    @property
    def load(self) -> int:
        """Requests this backend is busy with: the larger of what it reports and what we sent it."""
        return max(self.in_flight, self.running + self.queued)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The candidates of one route at one moment."""

    backends: tuple[BackendState, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and why; ``reason`` becomes the ``x-spillgate-reason`` header."""

    backend: str
    reason: str
    ranked: tuple[str, ...] = ()
    """Every candidate in preference order, so a failed attempt can fall back to the next."""


class NoCandidate(Exception):
    """No backend passes the filters; the gateway answers 503."""
