"""Everything a running gateway holds, built once from the config and owned by the app."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from backends.http1 import Http1Client
from backends.registry import Backend, BackendRegistry
from cache.shared_index import SharedPrefixIndex
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.prefix import PrefixTracker
from gateway.secrets import resolve_secret
from gateway.tenants import TenantDirectory
from policies.engine import Policy
from policies.registry import build_policy

_ASSUMED_KV_TOKENS = 200_000
"""Index capacity for a replica until its ``/get_server_info`` says how many tokens its KV cache holds."""


@dataclass
class Route:
    """A name clients put in ``model``, the backends that may serve it, and how to choose among them."""

    name: str
    targets: tuple[str, ...]
    policy: Policy
    _sequence: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def next_sequence(self) -> int:
        return next(self._sequence)


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
            )
            for index, url in enumerate(replica_urls[pool.name])
        ]
        backends += pool_backends
        members[pool.name] = [b.name for b in pool_backends]
    for hosted in config.hosted_models:
        api_key = resolve_secret(hosted.api_key) if hosted.api_key else None
        backends.append(Backend(hosted.name, "hosted", hosted_urls[hosted.name].rstrip("/"), hosted.model, api_key))
        members[hosted.name] = [hosted.name]
    routes: dict[str, Route] = {}
    for route_config in config.routes:
        targets = tuple(name for target in route_config.targets for name in members[target])
        route = Route(route_config.name, targets, build_policy(route_config.policy))
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
        tenants=TenantDirectory(config.tenants, required=config.auth.required, route_aliases=aliases),
        upstream=Http1Client(connect_timeout=config.timeouts.connect_s, read_timeout=config.timeouts.read_s),
        metrics=GatewayMetrics(),
    )
