"""Policies by the name a route's config gives them."""

from __future__ import annotations

from spillgate.policies.engine import FixedReason, Policy, WeightedScorer
from spillgate.policies.plugins import (
    BestScorePicker,
    ConsistentHashPicker,
    HealthyFilter,
    LeastLoadScorer,
    PowerOfTwoPicker,
    PredictedTTFTScorer,
    PrefixAffinityScorer,
    PrefixHitScorer,
    PrefixReason,
    RotatingPicker,
)

POLICY_NAMES = ("round_robin", "least_load", "power_of_two", "consistent_hash", "cache_aware")


def build_policy(name: str, affinity: PrefixAffinityScorer | None = None) -> Policy:
    """Assemble the named policy from plug-ins; raise ``KeyError`` for an unknown name.

    ``affinity``: ``cache_aware``'s affinity guard with other settings than its defaults (ignored by the
    policies without one)."""
    healthy = (HealthyFilter(),)
    if name == "round_robin":
        return Policy(name, healthy, (), RotatingPicker(), FixedReason(name))
    if name == "least_load":
        return Policy(name, healthy, (WeightedScorer(LeastLoadScorer(), 1.0),), BestScorePicker(), FixedReason(name))
    if name == "power_of_two":
        return Policy(name, healthy, (), PowerOfTwoPicker(), FixedReason(name))
    if name == "consistent_hash":
        return Policy(name, healthy, (), ConsistentHashPicker(), FixedReason(name), uses_prefix=True)
    if name == "cache_aware":
        # Affinity outweighs the others together (2.01): a guard inside it, not a trade-off, decides moves.
        scorers = (
            WeightedScorer(affinity or PrefixAffinityScorer(), 4.0),
            WeightedScorer(PredictedTTFTScorer(), 1.0),
            WeightedScorer(LeastLoadScorer(), 1.0),
            WeightedScorer(PrefixHitScorer(), 0.01),
        )
        return Policy(name, healthy, scorers, BestScorePicker(), PrefixReason("least_ttft"), uses_prefix=True)
    raise KeyError(name)
