"""Everything a running gateway holds, built once from the config and owned by the app."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from backends.hosted import HostedModel, Price, PriceOverride
from backends.http1 import Http1Client
from backends.prefill_rate import PrefillRateEstimator
from backends.registry import Backend, BackendRegistry
from cache.shared_index import SharedPrefixIndex
from gateway.config import GatewayConfig, RouteConfig, SpillConfig
from gateway.metrics import GatewayMetrics
from gateway.prefix import PrefixTracker
from gateway.secrets import resolve_secret
from gateway.tenants import TenantDirectory
from policies.complexity import ComplexityClassifier
from policies.engine import Policy
from policies.registry import build_policy
from policies.spill import HybridPolicy
from policies.types import Decision

_ASSUMED_KV_TOKENS = 200_000
"""Index capacity for a replica until its ``/get_server_info`` says how many tokens its KV cache holds."""


@dataclass
class Route:
    """A name clients put in ``model``, the backends that may serve it, and how to choose among them."""

    name: str
    targets: tuple[str, ...]
    policy: Policy | HybridPolicy
    spill: SpillConfig
    reference_price: Price | None = None
    """The cheapest hosted target's price: what savings are measured against."""
    complex_tier: int = 0
    """The tier a prompt scored complex must get: above every replica's, if a hosted target has one."""
    spilling: bool = False
    """Whether the last overflow decision spilled: the hysteresis state, fed back into the next decision."""
    dedicated_targets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """For each tenant with dedicated pools: its pools' replicas (and the route's hosted targets)."""
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


_KEPT_BY_RULE = frozenset({"residency", "budget", "queued", "best_effort"})
"""Reasons a replica served although it missed the SLO: not evidence that the pool has recovered."""


def _hosted_models(config: GatewayConfig, hosted_urls: Mapping[str, str]) -> dict[str, HostedModel]:
    """Hosted models with resolved keys and prices; loads litellm (seconds) only when there are any."""
    if not config.hosted_models:
        return {}
    import backends.hosted.client  # noqa: F401  (litellm, offline, at start-up rather than on a request)

    models = {}
    for hosted in config.hosted_models:
        override = PriceOverride(hosted.input_per_mtok, hosted.output_per_mtok, hosted.cached_input_per_mtok)
        models[hosted.name] = HostedModel(
            name=hosted.name,
            litellm_model=hosted.model,
            api_base=hosted_urls.get(hosted.name) or hosted.api_base,
            api_key=resolve_secret(hosted.api_key) if hosted.api_key else None,
            timeout_s=hosted.timeout_s,
            connect_timeout_s=config.timeouts.connect_s,
        ).with_price(override)
    return models


def _reference_price(route: RouteConfig, hosted_models: Mapping[str, HostedModel]) -> Price | None:
    prices = [m.price for name, m in hosted_models.items() if name in route.targets and m.price is not None]
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


def _route_policy(route: RouteConfig, hosted_names: set[str]) -> Policy | HybridPolicy:
    replicas = build_policy(route.policy)
    if not any(target in hosted_names for target in route.targets):
        return replicas
    return HybridPolicy(route.policy, replicas, on_slo_miss=route.spill.on_slo_miss, hysteresis=route.spill.hysteresis)


@dataclass
class GatewayState:
    config: GatewayConfig
    registry: BackendRegistry
    routes: Mapping[str, Route]
    """Every route under its name and each of its aliases."""
    tenants: TenantDirectory
    upstream: Http1Client
    metrics: GatewayMetrics
    prefix: PrefixTracker
    hosted_models: Mapping[str, HostedModel] = field(default_factory=dict)
    classifier: ComplexityClassifier = field(default_factory=ComplexityClassifier)

    async def start(self) -> None:
        if self.config.state.redis_url:
            client = aioredis.from_url(resolve_secret(self.config.state.redis_url), socket_timeout=2.0)
            stream = f"{self.config.state.key_prefix}:prefix-index"
            self.prefix.shared = SharedPrefixIndex(self.prefix.index, client, stream=stream)
            await self.prefix.shared.start()
        await self.registry.start()

    async def stop(self) -> None:
        await self.registry.stop()
        if self.prefix.shared is not None:
            await self.prefix.shared.stop()
        self.upstream.close()


def build_state(
    config: GatewayConfig, replica_urls: Mapping[str, list[str]], hosted_urls: Mapping[str, str]
) -> GatewayState:
    """Assemble the gateway; ``replica_urls`` and ``hosted_urls`` give the resolved endpoints per pool/model."""
    backends: list[Backend] = []
    members: dict[str, list[str]] = {}
    for pool in config.pools:
        pool_backends = [
            Backend(
                f"{pool.name}-{index}",
                "replica",
                url.rstrip("/"),
                pool.served_model,
                prefill_tokens_per_s=pool.prefill_tokens_per_s,
                tier=pool.tier,
                context_window=pool.context_window,
                # A replica's cost is its GPU time: $/hour over the tokens it produces in an hour.
                usd_per_mtok_out=pool.gpu_usd_per_hour / (pool.output_tokens_per_s * 3600) * 1e6,
            )
            for index, url in enumerate(replica_urls[pool.name])
        ]
        # Replicas of a pool are the same model on the same GPUs: one shared estimate of their prefill
        # rate learns from all of them, and no replica looks faster than its twins by noise alone.
        shared_rate = PrefillRateEstimator(pool.prefill_tokens_per_s)
        for backend in pool_backends:
            backend.prefill = shared_rate
        backends += pool_backends
        members[pool.name] = [b.name for b in pool_backends]
    hosted_models = _hosted_models(config, hosted_urls)
    for hosted in config.hosted_models:
        model = hosted_models[hosted.name]
        price = model.price
        backends.append(
            Backend(
                hosted.name,
                "hosted",
                model.api_base or "",
                hosted.model,
                tier=hosted.tier,
                context_window=hosted.context_window,
                usd_per_mtok_in=price.input * 1e6 if price else 0.0,
                usd_per_mtok_out=price.output * 1e6 if price else 0.0,
                ttft_s=hosted.ttft_ms / 1000,
                tpot_s=hosted.tpot_ms / 1000,
            )
        )
        members[hosted.name] = [hosted.name]
    routes: dict[str, Route] = {}
    hosted_names = {h.name for h in config.hosted_models}
    owners = {pool: t.name for t in config.tenants for pool in t.dedicated_pools}
    for route_config in config.routes:
        targets = tuple(name for target in route_config.targets if target not in owners for name in members[target])
        route = Route(
            route_config.name,
            targets,
            _route_policy(route_config, hosted_names),
            route_config.spill,
            complex_tier=_complex_tier(route_config, config),
            reference_price=_reference_price(route_config, hosted_models),
            dedicated_targets=_dedicated_targets(route_config, config, members, hosted_names),
        )
        for name in (route_config.name, *route_config.aliases):
            routes[name] = route

    aliases = {name: route.name for name, route in routes.items()}
    prefix = PrefixTracker(block_chars=config.prefix.block_chars, max_blocks=config.prefix.max_blocks)
    for backend in backends:
        if backend.kind == "replica":
            prefix.capacity_known(backend.name, _ASSUMED_KV_TOKENS)
    return GatewayState(
        config=config,
        registry=BackendRegistry(
            backends,
            interval_s=config.health.interval_s,
            timeout_s=config.health.timeout_s,
            unhealthy_after=config.health.unhealthy_after,
            events=prefix,
        ),
        prefix=prefix,
        routes=routes,
        tenants=TenantDirectory(
            config.tenants, required=config.auth.required, route_aliases=aliases, admin=config.admin
        ),
        upstream=Http1Client(connect_timeout=config.timeouts.connect_s, read_timeout=config.timeouts.read_s),
        metrics=GatewayMetrics(),
        hosted_models=hosted_models,
    )
