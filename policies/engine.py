"""A policy is filters, then weighted scorers, then a picker: each a small plug-in chosen by config.

Policies are pure: a decision is a function of the request and a snapshot of backend state, so the same
code runs in the live gateway, in tests and in offline simulation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from spillgate.policies.prediction import Candidates
from spillgate.policies.types import BackendState, Decision, NoCandidate, RouteRequest, Snapshot


class Filter(Protocol):
    def keep(self, request: RouteRequest, backend: BackendState) -> bool: ...


class Scorer(Protocol):
    """Scores every candidate at once in [0, 1], higher is better; at once so scores can be relative."""

    def scores(self, request: RouteRequest, candidates: Candidates) -> list[float]: ...


class Picker(Protocol):
    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]: ...


class Reasoner(Protocol):
    """Names why the chosen backend won, for ``x-spillgate-reason`` and the metrics."""

    def reason(self, request: RouteRequest, chosen: BackendState) -> str: ...


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class FixedReason:
    name: str

    def reason(self, request: RouteRequest, chosen: BackendState) -> str:
        return self.name


@dataclass(frozen=True)
class Policy:
    """A :class:`~policies.types.Decider` built from plug-ins; :mod:`policies.registry` names them for configs."""

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    reasoner: Reasoner
    uses_prefix: bool = False
    """Whether decisions read prefix-cache state, so the gateway fingerprints prompts only when needed."""

    def decide(self, request: RouteRequest, snapshot: Snapshot) -> Decision:
        backends = list(snapshot.backends)
        for filter_ in self.filters:
            keep = filter_.keep
            backends = [b for b in backends if keep(request, b)]
        if not backends:
            raise NoCandidate(f"no healthy backend for route {request.route!r}")
        candidates = Candidates(request, backends)
        totals = [0.0] * len(backends)
        for weighted in self.scorers:
            weight = weighted.weight
            totals = [t + weight * s for t, s in zip(totals, weighted.scorer.scores(request, candidates), strict=True)]
        ranked = self.picker.rank(request, list(zip(totals, backends, strict=True)))
        return Decision(ranked[0].name, self.reasoner.reason(request, ranked[0]), tuple([b.name for b in ranked]))


def scorer_name(scorer: Scorer) -> str:
    """The name a config uses for a scorer: its class name in snake case, without ``Scorer``
    (``PredictedTTFTScorer`` -> ``predicted_ttft``)."""
    base = type(scorer).__name__.removesuffix("Scorer")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()


def with_weights(policy: Policy, weights: Mapping[str, float]) -> Policy:
    """``policy`` with some scorers' weights replaced; raises ``KeyError`` naming any unknown scorer."""
    if not weights:
        return policy
    names = [scorer_name(weighted.scorer) for weighted in policy.scorers]
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise KeyError(f"{policy.name} has no scorer {unknown[0]!r}; its scorers: {names}")
    scorers = tuple(
        WeightedScorer(weighted.scorer, weights.get(name, weighted.weight))
        for name, weighted in zip(names, policy.scorers, strict=True)
    )
    return replace(policy, scorers=scorers)
