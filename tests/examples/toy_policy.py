"""A toy policy: each request goes to the healthy replica with the most free KV cache, as last scraped."""

from __future__ import annotations

from dataclasses import dataclass

from spillgate.policies.engine import FixedReason, Policy, WeightedScorer
from spillgate.policies.plugins import BestScorePicker, HealthyFilter
from spillgate.policies.prediction import Candidates
from spillgate.policies.registry import PolicyParams, register_policy, takes_no_params
from spillgate.policies.types import RouteRequest


@dataclass(frozen=True, slots=True)
class FreeKVScorer:
    """1.0 for an empty KV cache, 0.0 for a full one; a route's ``weights`` call it ``free_kv``."""

    def scores(self, request: RouteRequest, candidates: Candidates) -> list[float]:
        return [1.0 - b.token_usage for b in candidates.backends]


def most_free_kv(params: PolicyParams) -> Policy:
    """Healthy backends only, the most free KV cache first; equal ones take turns."""
    takes_no_params("most_free_kv", params)
    scorers = (WeightedScorer(FreeKVScorer(), 1.0),)
    return Policy("most_free_kv", (HealthyFilter(),), scorers, BestScorePicker(), FixedReason("most_free_kv"))


register_policy("most_free_kv", most_free_kv)
