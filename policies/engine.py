"""A policy is filters, then weighted scorers, then a picker: each a small plug-in chosen by config.

Policies are pure: a decision is a function of the request and a snapshot of backend state, so the same
code runs in the live gateway, in tests and in offline simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.types import BackendState, Decision, NoCandidate, RouteRequest, Snapshot


class Filter(Protocol):
    def keep(self, request: RouteRequest, backend: BackendState) -> bool: ...


class Scorer(Protocol):
    """Scores a candidate in [0, 1]; higher is better."""

    def score(self, request: RouteRequest, backend: BackendState, snapshot: Snapshot) -> float: ...


class Picker(Protocol):
    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]: ...


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(frozen=True)
class Policy:
    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker

    def decide(self, request: RouteRequest, snapshot: Snapshot) -> Decision:
        candidates = [b for b in snapshot.backends if all(f.keep(request, b) for f in self.filters)]
        if not candidates:
            raise NoCandidate(f"no healthy backend for route {request.route!r}")
        scored = [(sum(s.weight * s.scorer.score(request, b, snapshot) for s in self.scorers), b) for b in candidates]
        ranked = self.picker.rank(request, scored)
        return Decision(backend=ranked[0].name, reason=self.name, ranked=tuple(b.name for b in ranked))
