"""Everything a running gateway holds, owned by the app; config versions swap in through :meth:`apply`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis.asyncio as aioredis
from tokenizers import Tokenizer

from spillgate.backends.hosted import HostedModel
from spillgate.backends.hosted.direct import new_http_client
from spillgate.backends.http1 import Http1Client
from spillgate.backends.outlier import OutlierRules
from spillgate.backends.registry import BackendRegistry
from spillgate.cache.shared_index import SharedPrefixIndex
from spillgate.cache.template import NoChatTemplate, TemplateTokenizer
from spillgate.cache.tokens import PromptIds, PromptTokenizer, named_prompt_ids
from spillgate.gateway.accounting import Accountant, make_client
from spillgate.gateway.accounting.rent import RentBook
from spillgate.gateway.capacity.recorder import CapacityRecorder
from spillgate.gateway.capacity.sampler import sample_forever
from spillgate.gateway.control.catalog import Catalog, Endpoints, build_catalog
from spillgate.gateway.control.config import ConfigError, GatewayConfig, StateConfig
from spillgate.gateway.control.data_dir import data_directory
from spillgate.gateway.control.discovery import Discovery
from spillgate.gateway.control.live_config import LiveConfig
from spillgate.gateway.control.routes import Route
from spillgate.gateway.control.secrets import MissingSecret, resolve_secret
from spillgate.gateway.dispatch.coalesce import PrefillsInFlight
from spillgate.gateway.dispatch.kv_feeds import KvEventFeeds
from spillgate.gateway.dispatch.peer_load import PeerLoad
from spillgate.gateway.dispatch.prefix import PrefixTracker
from spillgate.gateway.dispatch.retry_budget import RetryBudget
from spillgate.gateway.dispatch.ticket import Dispatcher
from spillgate.gateway.observability.metrics import GatewayMetrics
from spillgate.gateway.tenancy.spend_view import LedgerSpend
from spillgate.gateway.tenancy.tenants import TenantDirectory
from spillgate.policies.complexity import ComplexityClassifier

log = logging.getLogger("spillgate.discovery")

_ASSUMED_KV_TOKENS = 200_000
"""Index capacity for a replica until its ``/get_server_info`` says how many tokens its KV cache holds."""


@dataclass
class GatewayState:
    config: GatewayConfig
    endpoints: Endpoints
    registry: BackendRegistry
    routes: Mapping[str, Route]
    """Every route under its name and each of its aliases."""
    tenants: TenantDirectory
    upstream: Http1Client
    metrics: GatewayMetrics
    prefix: PrefixTracker
    prefilling: PrefillsInFlight = field(default_factory=PrefillsInFlight)
    """Prefix blocks each replica is computing now, for requests that share them to wait for."""
    hosted_models: Mapping[str, HostedModel] = field(default_factory=dict)
    hosted_http: httpx.AsyncClient = field(default_factory=new_http_client)
    """Connections to hosted providers for the streams relayed without litellm (:mod:`backends.hosted.direct`)."""
    classifier: ComplexityClassifier = field(default_factory=ComplexityClassifier)
    rent: RentBook = field(default_factory=lambda: RentBook((), time.time()))
    """Each pool's rent since the gateway started, and who used it."""
    capacity: CapacityRecorder = field(default_factory=CapacityRecorder)
    """Each pool's demand and its replicas' load over the lookback, for the replicas it needs (``GET /capacity``)."""
    retries: RetryBudget = field(default_factory=RetryBudget)
    """How many fallbacks may be sent now (the config's ``outlier.retry_budget_*``)."""
    live: LiveConfig | None = None
    """Versions of the config and the way to change it; set by ``spillgate serve``."""
    data_dir: Path = field(default_factory=lambda: data_directory(StateConfig(), None))
    """Where the cost ledger and the config history live (:func:`data_directory`)."""
    accountant: Accountant = field(init=False)
    """Rate limits, budgets and the cost ledger; built by :meth:`start` (it may need Redis)."""
    _accounting_redis: aioredis.Redis | None = field(default=None, init=False)
    peer_load: PeerLoad | None = field(default=None, init=False)
    """With Redis: the other gateway processes' load at each replica, added to this one's."""
    _capacity_sampling: asyncio.Task[None] | None = field(default=None, init=False)
    dispatcher: Dispatcher = field(init=False)
    """Books each attempt on its backend (:mod:`gateway.dispatch.ticket`): the only writer of this process's load."""
    kv_feeds: KvEventFeeds = field(init=False)
    """The replicas' KV-cache event subscriptions, feeding ``prefix``."""
    discovery: Discovery = field(init=False)
    """The replicas found at run time (Kubernetes pods), by pool: runtime state, never in a config version."""

    def __post_init__(self) -> None:
        self.dispatcher = Dispatcher(self.prefilling, self.prefix)
        self.kv_feeds = KvEventFeeds(self.prefix)
        self.discovery = Discovery(self.rediscover)

    def catalog_for(self, config: GatewayConfig) -> Catalog:
        """What ``config`` builds here: its backends with the replicas discovered now, reusing the running (and
        draining) backends that kept their name and address."""
        existing = self.registry.known()
        return build_catalog(config, self.endpoints, existing, self.discovery.replicas(config))

    def rediscover(self) -> bool:
        """A pool's discovered replicas changed: the running config's catalog again, with them. ``False`` when it
        could not be built, so discovery offers the same set again later."""
        try:
            self.apply(self.catalog_for(self.config))
        except (ConfigError, MissingSecret) as exc:  # the environment changed under the running config
            log.error("discovered replicas could not be applied; the catalog stays as it was: %s", exc)
            return False
        return True

    @property
    def spend(self) -> LedgerSpend:
        """The ledger's spend, as the dashboard reads it."""
        return LedgerSpend(self.accountant)

    def apply(self, catalog: Catalog) -> None:
        """Switch to a new config version. Plain attribute swaps, so no request sees half of one: a request
        admitted under the old version keeps its route and tenant objects until it finishes."""
        replicas = {b.name: b for b in catalog.backends if b.kind == "replica"}
        serving = {b.name: b for b in self.registry}
        for name in self.prefix.index.replicas():
            # Gone from the config (a probe still running may have registered it again after an earlier
            # removal), or the name now points at another address (a new backend object).
            if name not in replicas or replicas[name] is not serving.get(name):
                self.prefix.removed(name)
        for backend in replicas.values():
            if not self.prefix.index.knows(backend.name):
                self.prefix.capacity_known(backend.name, backend.max_total_tokens or _ASSUMED_KV_TOKENS)
        self.registry.replace(catalog.backends)
        self.upstream.retain({b.base_url for b in replicas.values()})
        self.routes = catalog.routes
        catalog.tenants.managed = self.tenants.managed  # keys made through /admin/keys outlive config versions
        self.tenants = catalog.tenants
        self.hosted_models = catalog.hosted_models
        self.rent.configure(catalog.pool_prices, time.time())
        outlier = catalog.config.outlier
        self.registry.outlier = OutlierRules(
            outlier.consecutive_failures, outlier.base_ejection_s, outlier.max_ejection_s, outlier.max_ejected_percent
        )
        self.retries.configure(
            ratio=outlier.retry_budget_ratio,
            min_per_s=outlier.retry_budget_min_per_s,
            window_s=outlier.retry_budget_window_s,
        )
        self.capacity.configure(catalog.config, (b.name for b in replicas.values()), time.perf_counter())
        self.config = catalog.config
        self.discovery.configure(catalog.config)

    async def start(self) -> None:
        settings = self.config.state
        client = None
        if settings.redis_url:
            url = resolve_secret(settings.redis_url)
            self._accounting_redis = make_client(url)
        self.accountant = Accountant(
            self.data_dir / "ledger.sqlite3",
            redis=self._accounting_redis,
            key_prefix=settings.key_prefix,
            fail_open=settings.on_redis_outage == "fail_open",
        )
        await self.accountant.start()
        if settings.redis_url:
            client = aioredis.from_url(resolve_secret(settings.redis_url), socket_timeout=2.0)
            stream = f"{self.config.state.key_prefix}:prefix-index"
            self.prefix.shared = SharedPrefixIndex(self.prefix.index, client, stream=stream)
            self.prefix.shared.prefills = self.prefilling
            self.prefix.shared.sent_elsewhere = self.prefix.sent_elsewhere
            await self.prefix.shared.start()
            if settings.share_load_interval_s > 0:
                load_client = aioredis.from_url(resolve_secret(settings.redis_url), socket_timeout=2.0)
                self.peer_load = PeerLoad(
                    self.registry,
                    load_client,
                    key=f"{settings.key_prefix}:load",
                    interval_s=settings.share_load_interval_s,
                )
                await self.peer_load.start()
                if self.accountant.shared is not None:
                    peers = self.peer_load
                    self.accountant.shared.processes = lambda: 1 + peers.peers
        if self.live is not None:
            await self.live.start(client)
        await self.discovery.start()
        await self.registry.start()
        await self.kv_feeds.start(self.registry)
        self._capacity_sampling = asyncio.create_task(
            sample_forever(self.capacity, self.registry, lambda: self.config.health.interval_s)
        )

    async def stop(self) -> None:
        if self._capacity_sampling is not None:
            self._capacity_sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._capacity_sampling
        if self.live is not None:
            await self.live.stop()
        await self.discovery.stop()
        await self.registry.stop()
        await self.kv_feeds.stop()
        await self.accountant.stop()
        if self._accounting_redis is not None:
            await self._accounting_redis.aclose()
        if self.prefix.shared is not None:
            await self.prefix.shared.stop()
        if self.peer_load is not None:
            await self.peer_load.stop()
        self.upstream.close()
        await self.hosted_http.aclose()


def build_state(
    config: GatewayConfig,
    replica_urls: Mapping[str, list[str]],
    hosted_urls: Mapping[str, str],
    config_path: Path | None = None,
) -> GatewayState:
    """Assemble the gateway; ``replica_urls`` and ``hosted_urls`` give the simulators started for it, and
    ``config_path`` the file the config came from (where its data directory is found)."""
    endpoints = Endpoints(replica_urls, hosted_urls)
    catalog = build_catalog(config, endpoints, {})
    settings = config.prefix
    prefix = PrefixTracker(
        block_chars=settings.block_chars,
        max_blocks=settings.max_blocks,
        tokenizer=None if settings.tokenizer is None else load_tokenizer(settings.tokenizer),
        block_tokens=settings.block_tokens,
    )
    registry = BackendRegistry(
        catalog.backends,
        interval_s=config.health.interval_s,
        timeout_s=config.health.timeout_s,
        unhealthy_after=config.health.unhealthy_after,
        generation_check_s=config.health.generation_check_s,
        events=prefix,
    )
    state = GatewayState(
        config=config,
        endpoints=endpoints,
        registry=registry,
        prefix=prefix,
        routes=catalog.routes,
        tenants=catalog.tenants,
        upstream=Http1Client(connect_timeout=config.timeouts.connect_s, read_timeout=config.timeouts.read_s),
        metrics=GatewayMetrics(),
        hosted_models=catalog.hosted_models,
        data_dir=data_directory(config.state, config_path),
    )
    state.apply(catalog)
    return state


def load_tokenizer(path: str) -> PromptIds:
    """``prefix.tokenizer``: a registered name (``simulated``), a model directory (the engine's exact ids, through
    its chat template), or a tokenizer.json alone (ids of the prompt's records); a :class:`ConfigError` if none."""
    named = named_prompt_ids(path)
    if named is not None:
        return named
    if Path(path).is_dir():
        try:
            return TemplateTokenizer.from_directory(path)
        except (NoChatTemplate, OSError, ValueError) as exc:
            raise ConfigError(f"prefix.tokenizer: {exc}") from None
    try:
        return PromptTokenizer(Tokenizer.from_file(path))
    except Exception as exc:  # tokenizers raises its own Exception subclasses for a missing or malformed file
        raise ConfigError(f"prefix.tokenizer: cannot load {path!r} as a Hugging Face tokenizer.json ({exc})") from None
