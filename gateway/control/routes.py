"""Routes: the names clients put in ``model``, the backends that may serve each, and how to choose."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from spillgate.backends.engines import Engine, engine_named
from spillgate.backends.hosted import HostedModel, Price
from spillgate.gateway.control.config import GatewayConfig, RouteConfig, SpillConfig
from spillgate.policies.complexity_modelfile import route_complexity
from spillgate.policies.complexity_ngram import NgramClassifier
from spillgate.policies.spill import HybridPolicy
from spillgate.policies.types import Decider, Decision


@dataclass
class Route:
    """A name clients put in ``model``, the backends that may serve it, and how to choose among them."""

    name: str
    targets: tuple[str, ...]
    policy: Decider
    spill: SpillConfig
    reference_price: Price | None = None
    """The cheapest hosted target's price: what savings are measured against."""
    complex_tier: int = 0
    """The tier a prompt scored complex must get: above every replica's, if a hosted target has one."""
    embeddings: bool = False
    """Its targets are ``task: embed``: it serves ``/v1/embeddings`` and nothing else (a route has one task)."""
    classifier: NgramClassifier | None = None
    """The route's complexity classifier when its spill config names a model; None: the gateway's built-in one."""
    complexity_threshold: float | None = None
    """The score from which a prompt is complex: configured, or what ``complexity_share`` calibrates to."""
    spilling: bool = False
    """Whether the last overflow decision spilled: the hysteresis state, fed back into the next decision."""
    dedicated_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """For each tenant with dedicated pools: its pools' replicas (and the route's hosted targets)."""
    engine: Engine | None = None
    """The engine every pool of the route runs, whose way of rendering a chat the prefix index follows; None when
    its pools run different engines (the chat is rendered as sent)."""
    _sequence: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def targets_for(self, tenant: str) -> tuple[str, ...]:
        """The backends ``tenant`` may be served by: its dedicated replicas, or everything not dedicated."""
        return self.dedicated_targets.get(tenant, self.targets)

    def next_sequence(self) -> int:
        return next(self._sequence)

    def remember(self, decision: Decision, chosen_kind: str) -> None:
        """Track whether the route is spilling: set by an overflow, cleared when replicas win again."""
        if decision.reason == "overflow":
            self.spilling = True
        elif chosen_kind == "replica" and decision.reason not in _KEPT_BY_RULE:
            self.spilling = False


_KEPT_BY_RULE = frozenset({"residency", "budget", "priority", "queued", "best_effort"})
"""Reasons a replica served although it missed the SLO: not evidence that the pool has recovered."""


def _reference_price(route: RouteConfig, hosted_models: Mapping[str, HostedModel]) -> Price | None:
    """The cheapest hosted target's price, else the route's configured reference price, else none."""
    prices = [m.price for name, m in hosted_models.items() if name in route.targets and m.price is not None]
    configured = route.reference_price
    if not prices and configured is not None:
        cached = configured.cached_input_per_mtok
        return Price(
            configured.input_per_mtok / 1e6,
            configured.output_per_mtok / 1e6,
            (configured.input_per_mtok if cached is None else cached) / 1e6,
        )
    return min(prices, key=lambda p: p.cost(1000, 200), default=None)


def _complex_tier(route: RouteConfig, config: GatewayConfig) -> int:
    replica_tiers = [p.tier for p in config.pools if p.name in route.targets]
    hosted_tiers = [h.tier for h in config.hosted_models if h.name in route.targets]
    above = [tier for tier in hosted_tiers if tier > max(replica_tiers, default=0)]
    return min(above, default=0)


def _dedicated_targets(
    route: RouteConfig, config: GatewayConfig, members: Mapping[str, list[str]], hosted_names: set[str]
) -> dict[str, tuple[str, ...]]:
    hosted = [name for name in route.targets if name in hosted_names]
    return {
        tenant.name: tuple(
            name
            for target in route.targets
            if target in tenant.dedicated_pools or target in hosted
            for name in members[target]
        )
        for tenant in config.tenants
        if tenant.isolation == "dedicated"
    }


def _route_policy(route: RouteConfig, hosted_names: set[str]) -> Decider:
    replicas = route.replica_policy()
    if not any(target in hosted_names for target in route.targets):
        return replicas
    return HybridPolicy(route.policy, replicas, on_slo_miss=route.spill.on_slo_miss, hysteresis=route.spill.hysteresis)


def _route_engine(route_config: RouteConfig, config: GatewayConfig) -> Engine | None:
    engines = {pool.engine for pool in config.pools if pool.name in route_config.targets}
    return engine_named(engines.pop()) if len(engines) == 1 else None


def build_routes(
    config: GatewayConfig, members: Mapping[str, list[str]], hosted_models: Mapping[str, HostedModel]
) -> dict[str, Route]:
    """Every route under its name and each alias; ``members`` lists the backends of each pool/model."""
    routes: dict[str, Route] = {}
    hosted_names = {h.name for h in config.hosted_models}
    embedders = {p.name for p in config.pools if p.task == "embed"} | {
        h.name for h in config.hosted_models if h.task == "embed"
    }
    owners = {pool for t in config.tenants for pool in t.dedicated_pools}
    for route_config in config.routes:
        targets = tuple(name for target in route_config.targets if target not in owners for name in members[target])
        spill = route_config.spill
        classifier, threshold = route_complexity(
            spill.complexity_model, spill.complexity_threshold, spill.complexity_share
        )
        route = Route(
            route_config.name,
            targets,
            _route_policy(route_config, hosted_names),
            route_config.spill,
            complex_tier=_complex_tier(route_config, config),
            embeddings=bool(route_config.targets) and all(t in embedders for t in route_config.targets),
            classifier=classifier,
            complexity_threshold=threshold,
            reference_price=_reference_price(route_config, hosted_models),
            dedicated_targets=_dedicated_targets(route_config, config, members, hosted_names),
            engine=_route_engine(route_config, config),
        )
        for name in (route_config.name, *route_config.aliases):
            routes[name] = route
    return routes
