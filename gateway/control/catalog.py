"""What one config version builds: backends, hosted models, routes and tenants, swapped in as a whole.

Backends outlive config versions: a replica or hosted model that keeps its name and address keeps its
object, so in-flight bookkeeping, health and learned rates carry over, and requests admitted under the
old version settle on the same counters the new version routes by. A replica's name never depends on the
others (:mod:`replica_names`), so one joining or leaving its pool leaves every other where it was.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from spillgate.backends.backend import Backend
from spillgate.backends.discovery import DiscoveredReplica
from spillgate.backends.engines import Engine, KvEventSource, engine_named
from spillgate.backends.hosted import HostedModel, PriceOverride, UnknownModelPrice
from spillgate.backends.prefill_rate import PrefillRateEstimator
from spillgate.gateway.accounting.rent import PoolPrice
from spillgate.gateway.control.config import (
    ConfigError,
    GatewayConfig,
    HostedModelConfig,
    KvEventsConfig,
    PoolConfig,
)
from spillgate.gateway.control.replica_names import discovered_name, simulated_name
from spillgate.gateway.control.routes import Route, build_routes
from spillgate.gateway.control.secrets import resolve_secret
from spillgate.gateway.tenancy.tenants import TenantDirectory

log = logging.getLogger("spillgate.discovery")


@dataclass(frozen=True)
class Endpoints:
    """Addresses of the simulators the gateway started itself, by pool and hosted model name."""

    replicas: Mapping[str, list[str]]
    """Simulated replicas by pool; they follow the pool's configured ``replicas``."""
    hosted: Mapping[str, str]


@dataclass(frozen=True)
class Catalog:
    config: GatewayConfig
    backends: tuple[Backend, ...]
    routes: Mapping[str, Route]
    """Every route under its name and each of its aliases."""
    tenants: TenantDirectory
    hosted_models: Mapping[str, HostedModel]
    pool_prices: tuple[PoolPrice, ...] = ()
    """Each pool's rent and rates, at its size in this version."""


def build_catalog(
    config: GatewayConfig,
    endpoints: Endpoints,
    existing: Mapping[str, Backend],
    discovered: Mapping[str, Sequence[DiscoveredReplica]] | None = None,
) -> Catalog:
    """Build what ``config`` describes, reusing ``existing`` backends that kept their name and address.
    ``discovered``: the replicas each pool's discovery has found now (runtime state, never in the config)."""
    # What can fail (a missing secret, an admin key reused as a tenant key) comes before anything that
    # touches the live backends, so a refused version leaves them as they were.
    hosted_models = _hosted_models(config, endpoints.hosted)
    aliases = {name: route.name for route in config.routes for name in (route.name, *route.aliases)}
    tenants = TenantDirectory(config.tenants, required=config.auth.required, route_aliases=aliases, admin=config.admin)
    backends: list[Backend] = []
    members: dict[str, list[str]] = {}
    prices: list[PoolPrice] = []
    for pool in config.pools:
        simulated = endpoints.replicas.get(pool.name, []) if pool.simulated is not None else []
        urls = [*(r.url for r in pool.replicas), *simulated]
        names = [*pool.replica_names(), *(simulated_name(pool.name, index) for index in range(len(simulated)))]
        origins = ["config"] * len(pool.replicas) + ["simulated"] * len(simulated)
        found = (discovered or {}).get(pool.name, ()) if pool.discovery is not None else ()
        known = {url.rstrip("/") for url in urls}
        for replica in sorted(found):
            name = discovered_name(pool.name, replica.pod)
            if replica.url in known:
                log.info("discovered %s at %s is already in pool %s: served once", replica.pod, replica.url, pool.name)
                continue
            if name in names:
                log.warning(
                    "discovered %s at %s is not served: a configured replica of pool %s is named %s",
                    replica.pod,
                    replica.url,
                    pool.name,
                    name,
                )
                continue
            urls.append(replica.url)
            names.append(name)
            origins.append("discovered")
            known.add(replica.url)
        pool_backends = _pool_backends(pool, list(zip(names, urls, origins, strict=True)), existing)
        backends += pool_backends
        members[pool.name] = [b.name for b in pool_backends]
        prices.append(pool_price(pool, len(pool_backends)))
    for hosted in config.hosted_models:
        backends.append(_hosted_backend(hosted, hosted_models[hosted.name], existing))
        members[hosted.name] = [hosted.name]
    routes = build_routes(config, members, hosted_models)
    return Catalog(config, tuple(backends), routes, tenants, hosted_models, tuple(prices))


def pool_price(pool: PoolConfig, replicas: int) -> PoolPrice:
    return PoolPrice(pool.name, replicas, pool.gpu_usd_per_hour, pool.prefill_tokens_per_s, pool.output_tokens_per_s)


def _pool_backends(
    pool: PoolConfig, members: list[tuple[str, str, str]], existing: Mapping[str, Backend]
) -> list[Backend]:
    """A backend per (name, URL, origin), with the pool's settings."""
    api_key = resolve_secret(pool.api_key) if pool.api_key else None
    # A replica request's price is the GPU time it takes from the others (gateway.accounting.rent).
    price = pool_price(pool, 1)
    usd_per_mtok_in = price.usd(price.gpu_seconds(1_000_000, 0))
    usd_per_mtok_out = price.usd(price.gpu_seconds(0, 1_000_000))
    backends = []
    for name, url, origin in members:
        backend = _reuse(existing, name, "replica", url.rstrip("/"), engine_named(pool.engine))
        backend.origin = origin
        backend.served_model = pool.served_model
        backend.use_key(api_key)
        backend.prefill_tokens_per_s = pool.prefill_tokens_per_s
        backend.max_waiting_prefill = pool.max_waiting_prefill_tokens
        backend.tier = pool.tier
        if backend.info is None or not backend.info.context_window:
            backend.context_window = pool.context_window
        backend.pool = pool.name
        backend.kv_events_enabled = pool.kv_events.enabled
        backend.kv_events = _kv_event_source(pool.kv_events, backend.base_url)
        backend.usd_per_mtok_in, backend.usd_per_mtok_out = usd_per_mtok_in, usd_per_mtok_out
        backends.append(backend)
    # Replicas of a pool are the same model on the same GPUs: one shared estimate of their prefill rate
    # learns from all of them, and no replica looks faster than its twins by noise alone.
    kept = next((b.prefill for b in backends if existing.get(b.name) is b), None)
    shared_rate = kept or PrefillRateEstimator(pool.prefill_tokens_per_s)
    for backend in backends:
        backend.prefill = shared_rate
    return backends


def _kv_event_source(config: KvEventsConfig, base_url: str) -> KvEventSource | None:
    if config.endpoint is None:
        return None
    host = urlsplit(base_url).hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    replay = config.replay_endpoint
    return KvEventSource(
        endpoint=config.endpoint.replace("{host}", host),
        replay_endpoint=None if replay is None else replay.replace("{host}", host),
        topic=config.topic,
        ranks=config.dp_size,
    )


def _hosted_backend(hosted: HostedModelConfig, model: HostedModel, existing: Mapping[str, Backend]) -> Backend:
    backend = _reuse(existing, hosted.name, "hosted", model.api_base or "")
    fresh = backend.served_model != hosted.model
    backend.served_model = hosted.model
    backend.tier = hosted.tier
    backend.context_window = hosted.context_window
    price = model.price
    backend.usd_per_mtok_in = price.input * 1e6 if price else 0.0
    backend.usd_per_mtok_out = price.output * 1e6 if price else 0.0
    if fresh:  # latency priors until measured; a kept model keeps what it measured
        backend.ttft_s = hosted.ttft_ms / 1000
        backend.tpot_s = hosted.tpot_ms / 1000
    return backend


def _reuse(
    existing: Mapping[str, Backend], name: str, kind: str, base_url: str, engine: Engine | None = None
) -> Backend:
    """The backend of that name if it is still the same server (kind, address and engine), else a new one."""
    backend = existing.get(name)
    same_engine = backend is not None and (engine is None or backend.engine is engine)
    if backend is not None and same_engine and backend.kind == kind and backend.base_url == base_url:
        return backend
    fresh = Backend(name, kind, base_url, "")  # type: ignore[arg-type]
    if engine is not None:
        fresh.engine = engine
    return fresh


def _hosted_models(config: GatewayConfig, hosted_urls: Mapping[str, str]) -> dict[str, HostedModel]:
    """Hosted models with resolved keys and prices; loads litellm (seconds) only when there are any."""
    if not config.hosted_models:
        return {}
    from spillgate.backends.hosted.client import provider_of  # litellm, offline, at start-up rather than on a request

    unknown = [
        (f"hosted_models.{i}.model", f"litellm knows no provider for {hosted.model!r} (e.g. openai/gpt-4o)")
        for i, hosted in enumerate(config.hosted_models)
        if provider_of(hosted.model) is None
    ]
    if unknown:
        raise ConfigError.listing(unknown)
    models, unpriced = {}, []
    for i, hosted in enumerate(config.hosted_models):
        output = hosted.output_per_mtok
        if output is None and hosted.task == "embed":
            output = 0.0  # embeddings produce no output tokens: the input price is the whole price
        override = PriceOverride(
            hosted.input_per_mtok, output, hosted.cached_input_per_mtok, hosted.cache_write_per_mtok
        )
        model = HostedModel(
            name=hosted.name,
            litellm_model=hosted.model,
            api_base=hosted_urls[hosted.name] if hosted.simulated is not None else hosted.api_base,
            api_key=resolve_secret(hosted.api_key) if hosted.api_key else None,
            timeout_s=hosted.timeout_s,
            connect_timeout_s=config.timeouts.connect_s,
        )
        try:
            models[hosted.name] = model.with_price(override)
        except UnknownModelPrice as exc:
            unpriced.append((f"hosted_models.{i}.model", str(exc)))
    if unpriced:
        raise ConfigError.listing(unpriced)
    return models
