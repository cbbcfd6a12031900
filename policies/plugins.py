"""The filters, scorers and pickers that policies are assembled from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.types import BackendState, RouteRequest, Snapshot


@dataclass(frozen=True, slots=True)
class HealthyFilter:
    """Drops backends whose health checks fail."""

    def keep(self, request: RouteRequest, backend: BackendState) -> bool:
        return backend.healthy


@dataclass(frozen=True, slots=True)
class LeastLoadScorer:
    """Prefers the backend with the fewest requests in flight or queued, relative to the busiest one."""

    def score(self, request: RouteRequest, backend: BackendState, snapshot: Snapshot) -> float:
        busiest = max(b.load for b in snapshot.backends)
        return 1.0 - backend.load / busiest if busiest else 1.0


@dataclass(frozen=True, slots=True)
class BestScorePicker:
    """Highest score first; ties rotate with the request's sequence number so equal backends share work."""

    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]:
        count = len(scored)
        rotated = [scored[(i + request.sequence) % count] for i in range(count)]
        return [backend for _, backend in sorted(rotated, key=lambda item: -item[0])]


@dataclass(frozen=True, slots=True)
class RotatingPicker:
    """Round robin: the request's sequence number chooses, whatever the scores."""

    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]:
        count = len(scored)
        return [scored[(i + request.sequence) % count][1] for i in range(count)]
