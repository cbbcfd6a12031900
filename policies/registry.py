"""Policies by the name a route's config gives them."""

from __future__ import annotations

from policies.engine import Policy, WeightedScorer
from policies.plugins import BestScorePicker, HealthyFilter, LeastLoadScorer, RotatingPicker


def build_policy(name: str) -> Policy:
    """Assemble the named policy from plug-ins; raise ``KeyError`` for an unknown name."""
    if name == "round_robin":
        return Policy(name, (HealthyFilter(),), (), RotatingPicker())
    if name == "least_load":
        return Policy(name, (HealthyFilter(),), (WeightedScorer(LeastLoadScorer(), 1.0),), BestScorePicker())
    raise KeyError(name)


POLICY_NAMES = ("round_robin", "least_load")
