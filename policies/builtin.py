"""The policies spillgate ships, each assembled from plug-ins and registered under the name routes give it."""

from __future__ import annotations

from collections.abc import Mapping

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
from spillgate.policies.registry import PolicyParamError, PolicyParams, register_policy, takes_no_params

_HEALTHY = (HealthyFilter(),)


def _refuse_settings(name: str, params: PolicyParams) -> None:
    """The built-in policies other than ``cache_aware`` take no settings; ``affinity`` is ``cache_aware``'s."""
    if "affinity" in params:
        raise PolicyParamError("affinity", f"only cache_aware has an affinity guard, not {name}")
    takes_no_params(name, params)


def round_robin(params: PolicyParams) -> Policy:
    """Each healthy backend in turn, whatever its load."""
    _refuse_settings("round_robin", params)
    return Policy("round_robin", _HEALTHY, (), RotatingPicker(), FixedReason("round_robin"))


def least_load(params: PolicyParams) -> Policy:
    """The backend with the fewest requests; ties rotate."""
    _refuse_settings("least_load", params)
    scorers = (WeightedScorer(LeastLoadScorer(), 1.0),)
    return Policy("least_load", _HEALTHY, scorers, BestScorePicker(), FixedReason("least_load"))


def power_of_two(params: PolicyParams) -> Policy:
    """The less loaded of two backends drawn at random: near least-load without comparing them all."""
    _refuse_settings("power_of_two", params)
    return Policy("power_of_two", _HEALTHY, (), PowerOfTwoPicker(), FixedReason("power_of_two"))


def consistent_hash(params: PolicyParams) -> Policy:
    """The backend owning the prompt's prefix on a hash ring: affinity with no shared state."""
    _refuse_settings("consistent_hash", params)
    reason = FixedReason("consistent_hash")
    return Policy("consistent_hash", _HEALTHY, (), ConsistentHashPicker(), reason, uses_prefix=True)


_AFFINITY_BOUNDS = {"min_share": (0.0, 1.0), "max_slowdown": (1.0, 1000.0)}
"""The affinity guard's settings a route may change, each with its allowed range."""


def cache_aware(params: PolicyParams) -> Policy:
    """Warm replicas first unless their queues are far worse, then the lowest predicted TTFT; ``affinity``
    tunes the guard (:class:`~policies.plugins.PrefixAffinityScorer`)."""
    for param in params:
        if param != "affinity":
            raise PolicyParamError(param, f"cache_aware takes no {param!r} setting; it takes 'affinity'")
    affinity = _affinity_guard(params.get("affinity") or {})
    # Affinity outweighs the others together (2.01): a guard inside it, not a trade-off, decides moves.
    scorers = (
        WeightedScorer(affinity, 4.0),
        WeightedScorer(PredictedTTFTScorer(), 1.0),
        WeightedScorer(LeastLoadScorer(), 1.0),
        WeightedScorer(PrefixHitScorer(), 0.01),
    )
    return Policy("cache_aware", _HEALTHY, scorers, BestScorePicker(), PrefixReason("least_ttft"), uses_prefix=True)


def _affinity_guard(settings: object) -> PrefixAffinityScorer:
    """The guard with the route's settings; the ones left out keep their defaults."""
    if not isinstance(settings, Mapping):
        raise PolicyParamError("affinity", "the affinity settings are a mapping")
    values: dict[str, float] = {}
    for key, value in settings.items():
        where = f"affinity.{key}"
        if key not in _AFFINITY_BOUNDS:
            raise PolicyParamError(where, f"no affinity setting {key!r}; known: {sorted(_AFFINITY_BOUNDS)}")
        low, high = _AFFINITY_BOUNDS[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise PolicyParamError(where, f"{key} is a number from {low:g} to {high:g}")
        values[key] = float(value)
    return PrefixAffinityScorer(**values)


register_policy("round_robin", round_robin)
register_policy("least_load", least_load)
register_policy("power_of_two", power_of_two)
register_policy("consistent_hash", consistent_hash)
register_policy("cache_aware", cache_aware)
