"""The gateway's configuration: a YAML file validated by pydantic, failing fast with the field's path."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from spillgate.backends.engines import engine_names
from spillgate.gateway.control.egress import env_problems, origin, url_problems
from spillgate.gateway.control.plain_data import non_json_problems
from spillgate.gateway.control.replica_names import REPLICA_NAME_PATTERN, configured_name, simulated_name
from spillgate.policies.complexity_modelfile import ModelFileError, load_model
from spillgate.policies.engine import Policy, with_weights
from spillgate.policies.registry import PolicyParamError, build_policy, policy_names

DEMO_CONFIG_PATH = Path(str(files("spillgate.config") / "demo.yaml"))
"""The embedded demo: ``config/demo.yaml``, installed as package data."""

RECOMMENDED_SGLANG_FLAGS = ("--enable-metrics", "--enable-cache-report")
"""What an SGLang replica needs for the gateway to get every signal it uses (README, Real engines)."""
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/@-]+$")]
_DIGEST = re.compile(r"^sha256:[0-9a-fA-F]{64}$")
_ENV = re.compile(r"^os\.environ/[A-Za-z_][A-Za-z0-9_]*$")


def _check_key_spec(spec: str) -> str:
    if spec.startswith("sha256:") and not _DIGEST.match(spec):
        raise ValueError("a key digest is 'sha256:' followed by 64 hex digits")
    if spec.startswith("os.environ/") and not _ENV.match(spec):
        raise ValueError("an environment key is 'os.environ/NAME'")
    if len(spec) < 8 or spec != spec.strip():
        raise ValueError("a literal key has at least 8 characters and no surrounding spaces")
    return spec


def check_replica_url(url: str) -> str:
    """A replica's base URL, ``http(s)://host[:port]`` (one trailing ``/`` at most), parsed as the gateway will
    parse it when it sends there, so nothing accepted here can fail later; ``ValueError`` saying why not."""
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"{url!r} is not a replica URL: it contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsing it raises on a port that is not a number or out of range)
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a replica URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not a replica URL: the scheme must be http or https")
    if "@" in parts.netloc:
        raise ValueError(f"{url!r} is not a replica URL: no user or password")
    if not parts.hostname:
        raise ValueError(f"{url!r} is not a replica URL: it names no host")
    port = parts.netloc.rpartition("]")[2].partition(":")
    if port[1] and not (port[2].isascii() and port[2].isdigit() and 1 <= int(port[2]) <= 65535):
        raise ValueError(f"{url!r} is not a replica URL: the port must be a number from 1 to 65535")
    if parts.path not in ("", "/") or "?" in url or "#" in url:
        raise ValueError(f"{url!r} is not a replica URL: no path, query or fragment (http(s)://host:port)")
    return url


def _check_replica_name(name: str) -> str:
    """A configured replica's own name (:data:`REPLICA_NAME_PATTERN`), or ``ValueError`` saying what one is."""
    if not re.fullmatch(REPLICA_NAME_PATTERN, name) or len(name) > 63:
        raise ValueError(
            f"{name!r} is not a replica name: up to 63 letters, digits, '.', '_' or '-', from a letter or digit "
            "(it follows the pool's name and a '/'; a ':' is left to names from an address, host:port)"
        )
    return name


ReplicaUrl = Annotated[str, AfterValidator(check_replica_url)]
"""``http(s)://host[:port]``: see :func:`check_replica_url`."""
KeySpec = Annotated[str, AfterValidator(_check_key_spec)]
"""An API key as ``sha256:<64 hex digits>``, ``os.environ/NAME``, or the literal key."""


def _registered(names: Callable[[], tuple[str, ...]]) -> BeforeValidator:
    """A name that must be in a registry, looked up when a config is read so that plug-ins registered after this
    module loaded count; refused with the error a ``Literal`` of the names gives."""

    def check(value: object) -> object:
        known = names()
        if not isinstance(value, str) or value not in known:
            quoted = [repr(name) for name in known]
            expected = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else "".join(quoted)
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value

    return BeforeValidator(check)


PolicyName = Annotated[str, _registered(policy_names)]
"""A policy registered in :mod:`policies.registry`."""
EngineName = Annotated[str, _registered(engine_names)]
"""An engine registered in :mod:`backends.engines`."""


def _complexity_model(value: str) -> str:
    """A model file that loads and checks out, or a shipped model's name: else a config error on this field."""
    try:
        load_model(value)
    except ModelFileError as exc:
        raise PydanticCustomError("complexity_model", "{reason}", {"reason": str(exc)}) from None
    return value


ComplexityModelRef = Annotated[str, Field(min_length=1), AfterValidator(_complexity_model)]
"""A complexity model file (``spillgate complexity train``), or ``routellm``: the one shipped."""


class Strict(BaseModel):
    """Unknown fields are mistakes in a config file: refuse them instead of ignoring them."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StaticReplica(Strict):
    """One of a pool's ``replicas``, written as its URL or as ``{url, name}``. Its name keys what the gateway learns
    about it (:mod:`replica_names`): ``pool/name``, else ``pool/host:port``, so it keeps it whatever else joins or
    leaves the pool."""

    url: ReplicaUrl
    name: Annotated[str, AfterValidator(_check_replica_name)] | None = Field(
        default=None, description="shown after the pool's name (pool/name); default its host:port (pool/host:port)"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_url(cls, value: object) -> object:
        if isinstance(value, str):
            return {"url": check_replica_url(value)}  # a bad one is refused at the entry, as it was written
        if isinstance(value, dict | StaticReplica):
            return value
        raise ValueError("a replica is its URL (http://host:port) or {url: http://host:port, name: NAME}")

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> object:
        """A URL alone when unnamed, as it is usually written (the checks over raw configs read both forms)."""
        return self.url if self.name is None else handler(self)

    @property
    def address(self) -> str:
        """Where requests go: ``scheme://host:port`` (two entries with one address are one replica)."""
        return origin(self.url)


class ListenConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class LimitsConfig(Strict):
    """Bounds on what a client may send, checked before any backend is touched."""

    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_messages: int = Field(default=2048, gt=0)
    max_tokens: int = Field(default=32768, gt=0)
    max_choices: int = Field(default=16, gt=0, description="largest n / best_of a client may ask for")
    max_in_flight: int = Field(
        default=10_000,
        gt=0,
        description="completions the gateway serves at once; past it new ones get 503 overloaded at once, so "
        "hung backends or a flood cannot grow its memory without bound. A request takes a slot only once its key "
        "is valid and its whole body has arrived",
    )
    max_reading_body_bytes: int = Field(
        default=1 << 30,
        gt=0,
        description="bytes of request bodies still arriving, over all connections (a body is read before its "
        "request takes a slot); past it, 503 overloaded",
    )
    max_connections_per_client: int = Field(
        default=2048,
        ge=0,
        description="open connections one client address may hold (0: no cap); more are refused with 429. Above "
        "the pools of client SDKs (the OpenAI SDK's: 1,000); behind a load balancer every client shares its "
        "address: raise it or set 0 there. Read at start",
    )


class TimeoutsConfig(Strict):
    """Upstream timeouts in seconds: connecting, and the longest silence before or within a response; and the
    client's: how long its request headers and body may take, and its idle keep-alive connection stays open."""

    connect_s: float = Field(default=2.0, gt=0)
    read_s: float = Field(default=300.0, gt=0)
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        le=3600,
        description="longer than client pools and load balancers keep idle connections (aiohttp 15 s, AWS ALB 60 s), "
        "so the gateway never closes one as a client reuses it (a connection reset on the client's side)",
    )
    client_headers_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="from a connection's first byte (or its opening) to the end of its request headers; a slower "
        "client is closed with 408. Read at start",
    )
    client_body_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="from the end of the headers to the end of the body; a slower client gets 408 and holds no slot",
    )
    drain_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="on SIGTERM, how long requests in flight may take to finish; streams still open then end with "
        "an error event",
    )


class HealthConfig(Strict):
    """How replicas are probed: a quick liveness check and a ``/metrics`` scrape every interval, their limits read
    when they register, and now and then the engine's check that runs a generation (SGLang's ``/health``)."""

    interval_s: float = Field(default=1.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0, description="for the liveness check and the scrape")
    unhealthy_after: int = Field(default=2, ge=1, description="failed liveness checks in a row")
    generation_check_s: float = Field(
        default=10.0, ge=0, description="how often to run the engine's generation check, if it has one (0: never)"
    )


class OutlierConfig(Strict):
    """Passive outlier detection: replicas that fail real requests in a row leave rotation for a while, even
    while their liveness probe passes; and how many fallbacks the gateway may send (its retry budget)."""

    consecutive_failures: int = Field(
        default=5,
        ge=1,
        description="failed requests in a row (unreachable, broken or invalid response, 5xx, silent past "
        "timeouts.read_s) that eject a replica",
    )
    base_ejection_s: float = Field(default=10.0, gt=0, description="first ejection's length; doubles per repeat")
    max_ejection_s: float = Field(default=300.0, gt=0, description="longest ejection")
    max_ejected_percent: float = Field(
        default=50.0, ge=0, le=100, description="most of a pool's replicas ejected at once (a pool of one: none)"
    )
    retry_budget_ratio: float = Field(
        default=0.2, ge=0, description="fallbacks allowed as a share of requests over retry_budget_window_s"
    )
    retry_budget_min_per_s: float = Field(default=1.0, ge=0, description="fallbacks always allowed, per second")
    retry_budget_window_s: float = Field(default=10.0, ge=1, le=300)
    retry_backoff_s: float = Field(
        default=0.05, ge=0, le=5, description="a fallback waits a random time up to this before it is sent"
    )


class SimulatedReplicas(Strict):
    """Replicas the gateway starts itself as child processes (``spillgate sim-replica``)."""

    count: int = Field(default=1, ge=1, le=64)
    preset: str = "llama-3.1-8b-h100"
    time_scale: float = Field(default=1.0, gt=0)
    extra_args: list[str] = Field(
        default_factory=lambda: list(RECOMMENDED_SGLANG_FLAGS),
        description="flags for each simulated replica, SGLang's own names (default: the recommended "
        "--enable-metrics --enable-cache-report; [] runs them on SGLang's bare defaults)",
    )
    kv_events: bool = Field(
        default=False,
        description="publish KV-cache events (each replica gets --kv-events-config on free ports, which it "
        "reports in /server_info; the gateway follows them with prefix.tokenizer: simulated)",
    )


class KvEventsConfig(Strict):
    """Where a pool's replicas publish KV-cache events (their ``--kv-events-config``), for exact prefix routing.

    By default the gateway subscribes wherever a replica says it publishes (SGLang's ``/server_info``, vLLM's
    ``/kv_event_sources``); ``endpoint`` sets it instead, ``{host}`` standing for each replica's host."""

    enabled: bool = True
    endpoint: str | None = Field(
        default=None, pattern=r"^tcp://", description="e.g. tcp://{host}:5557; default: what the replica reports"
    )
    replay_endpoint: str | None = Field(
        default=None, pattern=r"^tcp://", description="the engine's replay socket, e.g. tcp://{host}:5558"
    )
    topic: str = Field(default="", description="the publisher's topic (a prefix; empty takes every topic)")
    dp_size: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="data-parallel ranks publishing (rank r on the endpoint's port + r, its replay socket on the "
        "replay port + r); default: what the replica reports (SGLang's dp_size, the ranks vLLM lists), else 1",
    )

    @model_validator(mode="after")
    def _ranks_fit(self) -> KvEventsConfig:
        if self.dp_size is None:
            return self
        if self.endpoint is None:
            raise ValueError(
                "dp_size needs endpoint: without an endpoint the replica's own report says where and how many "
                "ranks publish"
            )
        ranks = self.dp_size
        base = _port_of(self.endpoint)
        if base + ranks - 1 > 65535:
            raise ValueError(f"dp_size: {ranks} ranks from port {base} run past 65535")
        if self.replay_endpoint is not None:
            replay = _port_of(self.replay_endpoint)
            if base <= replay < base + ranks or replay <= base < replay + ranks:
                raise ValueError(
                    f"replay_endpoint: ports {replay}-{replay + ranks - 1} overlap the ranks' publishers "
                    f"{base}-{base + ranks - 1}; leave dp_size ports after each"
                )
        return self


def _port_of(endpoint: str) -> int:
    port = endpoint.rsplit(":", 1)[-1]
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{endpoint!r} ends in no port")
    return int(port)


class KubernetesDiscovery(Strict):
    """A pool's replicas as the Running, Ready pods of a namespace that match a label selector (list + watch)."""

    namespace: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="default: the gateway's own namespace (its service account's), else 'default'",
    )
    label_selector: str = Field(min_length=1, max_length=1024, description="e.g. app=sglang-llama-8b")
    port: Annotated[int, Field(ge=1, le=65535)] | Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] = (
        Field(description="the replica's port on each pod: a number, or the name of a container port")
    )
    scheme: Literal["http", "https"] = "http"

    @model_validator(mode="after")
    def _selector_reads(self) -> KubernetesDiscovery:
        from spillgate.backends.discovery.pods import SelectorError, parse_selector

        try:
            parse_selector(self.label_selector)
        except SelectorError as exc:
            raise ValueError(f"label_selector: {exc}") from None
        return self


class DiscoveryConfig(Strict):
    """Where a pool finds replicas at run time, besides its static ``replicas``."""

    kubernetes: KubernetesDiscovery


class PoolConfig(Strict):
    """A set of interchangeable replicas of one engine serving one model."""

    name: Name
    served_model: str = Field(min_length=1, description="the model name the replicas expect in requests")
    engine: EngineName = Field(
        default="sglang", description="sglang, vllm, openai (any compatible server), or another registered engine"
    )
    replicas: list[StaticReplica] = Field(
        default_factory=list,
        description="each http(s)://host:port (no path, query or user), or {url, name}; named pool/name, "
        "else pool/host:port",
    )
    api_key: str | None = Field(default=None, description="the replicas' --api-key: literal, or os.environ/NAME")
    simulated: SimulatedReplicas | None = None
    context_window: int = Field(
        default=131072, gt=0, description="until a replica lists its own max_model_len, which then wins"
    )
    prefill_tokens_per_s: float = Field(default=20000.0, gt=0, description="uncached prompt tokens/s, for TTFT")
    max_waiting_prefill_tokens: int | None = Field(
        default=None,
        ge=0,
        description="uncached prompt tokens that may wait unscheduled at a replica before the gateway holds new "
        "streamed prompts back; default an eighth of the replica's chunked_prefill_size, 0 never holds",
    )
    tier: int = Field(default=1, ge=0, description="quality tier; prompts scored complex need a higher one")
    gpu_usd_per_hour: float = Field(default=0.0, ge=0, description="one replica's rent per hour, busy or idle")
    output_tokens_per_s: float = Field(
        default=1000.0, gt=0, description="one replica's output tokens/s at full batch within the SLO (a load test)"
    )
    kv_events: KvEventsConfig = Field(default_factory=KvEventsConfig)
    task: Literal["generate", "embed"] = Field(
        default="generate",
        description="generate: chat and completions; embed: embeddings (SGLang --is-embedding, vLLM pooling models)",
    )
    discovery: DiscoveryConfig | None = Field(
        default=None, description="replicas found at run time (Kubernetes pods), besides the static ones"
    )

    @model_validator(mode="after")
    def _has_replicas(self) -> PoolConfig:
        if not self.replicas and self.simulated is None and self.discovery is None:
            raise ValueError("a pool needs 'replicas' (URLs), 'simulated' or 'discovery'")
        return self

    def replica_names(self) -> list[str]:
        """The configured replicas' names, in their order (:mod:`replica_names`)."""
        return [configured_name(self.name, replica.url, replica.name) for replica in self.replicas]

    def simulated_names(self) -> list[str]:
        """The simulated replicas' names, whatever their addresses this time."""
        count = self.simulated.count if self.simulated is not None else 0
        return [simulated_name(self.name, index) for index in range(count)]


class SimulatedHosted(Strict):
    """A hosted model the gateway simulates itself (``spillgate sim-hosted``)."""

    ttft_ms: float = Field(default=350.0, gt=0)
    tpot_ms: float = Field(default=12.0, gt=0)
    time_scale: float = Field(default=1.0, gt=0)


class HostedModelConfig(Strict):
    """A hosted frontier model, reached through litellm: any provider it supports."""

    name: Name
    model: str = Field(min_length=1, description="litellm model: openai/gpt-4o, anthropic/claude-..., bedrock/...")
    api_base: Annotated[str, Field(pattern=r"^https?://")] | None = None
    api_key: str | None = Field(default=None, description="literal, or os.environ/NAME; never from clients")
    simulated: SimulatedHosted | None = None
    context_window: int = Field(default=200000, gt=0)
    tier: int = Field(default=2, ge=0)
    input_per_mtok: float | None = Field(default=None, ge=0, description="USD per million prompt tokens")
    output_per_mtok: float | None = Field(default=None, ge=0, description="USD per million output tokens")
    cached_input_per_mtok: float | None = Field(default=None, ge=0, description="USD per million cached tokens")
    cache_write_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="USD per million tokens written to the prompt cache (default: litellm's price, else 1.25x "
        "input for Anthropic's models, else the input price)",
    )
    ttft_ms: float = Field(default=500.0, gt=0, description="expected TTFT until measured")
    tpot_ms: float = Field(default=20.0, gt=0, description="expected time per output token until measured")
    timeout_s: float = Field(default=120.0, gt=0, description="longest silence from the provider")
    task: Literal["generate", "embed"] = Field(
        default="generate",
        description="generate: chat and completions; embed: embeddings (SGLang --is-embedding, vLLM pooling models)",
    )


class SpillConfig(Strict):
    """When a route with hosted targets leaves the replicas."""

    complexity_threshold: float | None = Field(
        default=None, ge=0, le=1, description="complexity score from which a prompt needs the top tier"
    )
    complexity_model: ComplexityModelRef | None = Field(
        default=None,
        description="model file the complexity score comes from (a path written by 'spillgate complexity train', "
        "or 'routellm': shipped, trained on RouteLLM's evidence); default: the built-in cue score",
    )
    complexity_share: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="target share of asks called complex, turned into the threshold by the model's calibration; "
        "needs complexity_model; instead of complexity_threshold",
    )
    on_slo_miss: Literal["fastest", "queue", "reject"] = "fastest"
    hysteresis: float = Field(default=0.8, gt=0, le=1, description="replicas must beat this x SLO to win back")

    @model_validator(mode="after")
    def _one_threshold(self) -> SpillConfig:
        if self.complexity_share is not None and self.complexity_model is None:
            raise ValueError("complexity_share needs complexity_model: its calibration makes the share a threshold")
        if self.complexity_share is not None and self.complexity_threshold is not None:
            raise ValueError("give complexity_threshold or complexity_share, not both")
        return self


class AffinityConfig(Strict):
    """``cache_aware``'s affinity guard: when a request may leave the replicas holding its prefix. Unset fields
    keep the policy's defaults (docs/routing.md, the affinity guard). The policy's factory checks them again
    and refuses them for other policies; declared here for their field paths and descriptions."""

    min_share: float | None = Field(
        default=None, ge=0, le=1, description="a cached prefix under this share of the prompt binds nothing"
    )
    max_slowdown: float | None = Field(
        default=None, ge=1, le=1000, description="move when the warm replicas are predicted this many times slower"
    )


class ReferencePrice(Strict):
    """What a route's traffic would cost on a hosted API, for savings, when the route has no hosted model."""

    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens")
    output_per_mtok: float = Field(ge=0, description="USD per million output tokens")
    cached_input_per_mtok: float | None = Field(default=None, ge=0, description="default: the input price")


class RouteConfig(Strict):
    """What a client names in ``model``: the pools and hosted models that may serve it."""

    name: Name
    aliases: list[Name] = Field(default_factory=list)
    targets: list[Name] = Field(min_length=1)
    policy: PolicyName = "least_load"
    """How replicas are ranked; with hosted targets too, the cheapest candidate meeting the SLO wins."""
    weights: dict[str, Annotated[float, Field(ge=0, le=1000)]] = Field(default_factory=dict)
    """Scorer weights overriding the policy's defaults, by scorer name (``predicted_ttft``, ``prefix_hit``...)."""
    affinity: AffinityConfig | None = None
    """``cache_aware`` only: its affinity guard's settings."""
    spill: SpillConfig = SpillConfig()
    reference_price: ReferencePrice | None = None
    """The savings baseline when the route has no hosted target (with one, that model's price is)."""

    def policy_params(self) -> dict[str, Any]:
        """The route's settings for its policy, by field and only those set: what the policy's factory checks."""
        return {} if self.affinity is None else {"affinity": self.affinity.model_dump(exclude_none=True)}

    def replica_policy(self) -> Policy:
        """The policy that ranks this route's replicas, with the route's weights and settings; raises
        :class:`~policies.registry.PolicyParamError` for settings the policy refuses, ``KeyError`` for weights
        of scorers it lacks."""
        return with_weights(build_policy(self.policy, self.policy_params()), self.weights)


class SloConfig(Strict):
    """Latency targets a tenant's requests should meet; ``name`` is the SLO class metrics are counted under."""

    name: Name = "default"
    ttft_ms: float = Field(default=1000.0, gt=0)
    tpot_ms: float = Field(default=50.0, gt=0)


class RateLimitConfig(Strict):
    """Per-tenant rate limits over a sliding minute; tokens count prompt plus ``max_tokens`` until settled."""

    requests_per_minute: int | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)


class BudgetConfig(Strict):
    """Spend caps in USD per UTC day and month: everything, and the hosted part alone."""

    usd_per_day: float | None = Field(default=None, ge=0)
    usd_per_month: float | None = Field(default=None, ge=0)
    hosted_usd_per_day: float | None = Field(default=None, ge=0)
    hosted_usd_per_month: float | None = Field(default=None, ge=0)
    on_hosted_exceeded: Literal["self_hosted", "reject"] = "self_hosted"
    """Past a hosted cap: keep serving on the replicas (reason ``budget``), or refuse with 429."""


class TenantConfig(Strict):
    """A team sharing the gateway. Keys are ``sha256:<hex>`` digests, ``os.environ/NAME`` or literals;
    list two to rotate (both valid until the old one is removed)."""

    name: Name
    keys: list[KeySpec] = Field(min_length=1)
    routes: list[str] = Field(default_factory=lambda: ["*"])
    slo: SloConfig = SloConfig()
    residency: Literal["any", "self_hosted_only"] = "any"
    priority: Literal["high", "normal", "low"] = "normal"
    """Who gets paid-for overflow: ``low`` never spills for overflow (it waits or is refused instead)."""
    limits: RateLimitConfig = RateLimitConfig()
    budget: BudgetConfig = BudgetConfig()
    isolation: Literal["shared", "salted", "dedicated"] = "salted"
    """``salted`` (the default): the gateway sends a per-tenant ``cache_salt`` so replica caches are never shared.
    ``shared``: prefix index salted per tenant, replica caches shared (a co-tenant can time cache hits; tenants
    sending the same system prompt share its cache).
    ``dedicated``: only ``dedicated_pools`` serve this tenant, and they serve nobody else."""
    dedicated_pools: list[Name] = Field(default_factory=list)

    @model_validator(mode="after")
    def _dedicated_has_pools(self) -> TenantConfig:
        if (self.isolation == "dedicated") != bool(self.dedicated_pools):
            raise ValueError("isolation 'dedicated' and 'dedicated_pools' go together")
        return self


class AdminConfig(Strict):
    """Keys for the admin API and the all-tenant dashboard; never valid as tenant keys."""

    keys: list[KeySpec] = Field(default_factory=list)


class MetricsConfig(Strict):
    tenant_labels: bool = False
    """Label spend series with tenant names; off, they read ``tenant="all"``. Needs ``token``: the labels show
    every tenant's name and spend to whoever can read ``/metrics``."""
    token: KeySpec | None = None
    """When set, ``/metrics`` needs ``Authorization: Bearer <token>`` (Prometheus: ``authorization.credentials``);
    a literal, ``sha256:<hex>`` or ``os.environ/NAME``."""

    @model_validator(mode="after")
    def _labels_need_a_token(self) -> MetricsConfig:
        if self.tenant_labels and self.token is None:
            raise ValueError("tenant_labels shows every tenant's spend to whoever reaches /metrics: set a token too")
        return self


class LoggingConfig(Strict):
    """The access log: one structured line per request, every endpoint, on standard output. Live-editable."""

    access_log: bool = Field(default=True, description="one line per request, written off the request's path")
    format: Literal["json", "logfmt"] = Field(default="json", description="json: one object per line; logfmt")
    include_prompt: bool = Field(
        default=False,
        description="add each generation request's prompt (chat messages, or a completion's prompt) to its line: "
        "what users wrote lands in the log",
    )


class CapacityConfig(Strict):
    """How the gateway sizes each pool from what it measures (``GET /capacity``, ``spillgate_recommended_replicas``):
    replicas for the recent peak with headroom, one more on sustained pressure, never fewer than ``min_replicas``.
    Changing ``rate_window_s`` or ``lookback_s`` starts the measurements afresh."""

    headroom: float = Field(
        default=0.3, ge=0, le=10, description="spare capacity over the peak, for spikes, failures and deploys"
    )
    rate_window_s: float = Field(
        default=60.0, ge=1, le=3600, description="the peak is the highest mean arrival rate over a window this long"
    )
    lookback_s: float = Field(
        default=3600.0,
        ge=1,
        le=7 * 86400,
        description="how far back the peak (and a replica added for pressure) counts: scale-down waits this long",
    )
    sustain_s: float = Field(
        default=300.0, gt=0, description="queueing or KV usage over kv_high this long, unbroken, adds a replica"
    )
    kv_high: float = Field(default=0.9, gt=0, le=1, description="a pool's mean KV cache usage above this is pressure")
    min_replicas: int = Field(default=1, ge=0, description="warm replicas kept however quiet the traffic")

    @model_validator(mode="after")
    def _lookback_holds_windows(self) -> CapacityConfig:
        if self.lookback_s < self.rate_window_s:
            raise ValueError("lookback_s must be at least rate_window_s")
        if self.lookback_s / self.rate_window_s > 10_000:
            raise ValueError("lookback_s may be at most 10,000 rate windows (memory is kept per window)")
        return self


class PrefixConfig(Strict):
    """How prompts are fingerprinted for prefix-cache-aware routing."""

    block_chars: int = Field(default=256, ge=16, le=65536)
    max_blocks: int = Field(default=512, ge=1, le=16384)
    tokenizer: str | None = Field(
        default=None,
        description="the served model's directory (tokenizer.json and its chat template: the engine's exact token "
        "ids, which KV-cache events are matched against), a tokenizer.json alone, or a registered name such as "
        "'simulated'; blocks of block_tokens tokens instead of block_chars characters",
    )
    block_tokens: int = Field(default=64, ge=1, le=16384)


class StateConfig(Strict):
    """Where state shared by several gateway processes lives; without ``redis_url`` each process is alone."""

    redis_url: str | None = Field(default=None, description="redis://host:port/db, or os.environ/NAME")
    key_prefix: str = Field(default="spillgate", min_length=1, description="namespace of every Redis key")
    data_dir: str | None = Field(
        default=None,
        min_length=1,
        description="the cost ledger and config history; default a directory per config file under the user's "
        "state directory ($XDG_STATE_HOME/spillgate, else ~/.local/state/spillgate); a relative path is taken "
        "from the config file's directory",
    )
    on_redis_outage: Literal["fail_open", "fail_closed"] = "fail_open"
    """While Redis is unreachable limits are enforced per process; ``fail_closed`` refuses instead."""
    share_load_interval_s: float = Field(default=0.05, ge=0, le=10)
    """With Redis, how often each process tells the others what it has in flight at each replica (0: never)."""


class ResponsesConfig(Strict):
    """Responses stored for ``previous_response_id`` (``POST /v1/responses``): per tenant, bounded, expiring; in
    Redis when ``state.redis_url`` is set, so every gateway process sees them."""

    store_ttl_s: float = Field(default=30 * 86400, gt=0, description="how long a stored response can be chained")
    max_stored_per_tenant: int = Field(default=10000, ge=0, description="oldest dropped first; 0 stores none")


class AuthConfig(Strict):
    required: bool = True


class SecretsConfig(Strict):
    """What the config may read and where it may send: set at start only, so an admin key cannot widen it."""

    env: list[str] | None = Field(
        default=None,
        description="environment variables os.environ/NAME may name (default: those the config at start names)",
    )
    upstream_hosts: list[str] | None = Field(
        default=None,
        description="hosts (api.openai.com, *.internal) and networks (10.0.0.0/8) that replica and hosted "
        "model URLs may point to, and where a key may be sent beyond its start-up destinations (default: the "
        "hosts the config at start points to; no key widened)",
    )


class GatewayConfig(Strict):
    listen: ListenConfig = ListenConfig()
    limits: LimitsConfig = LimitsConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    health: HealthConfig = HealthConfig()
    outlier: OutlierConfig = OutlierConfig()
    auth: AuthConfig = AuthConfig()
    admin: AdminConfig = AdminConfig()
    metrics: MetricsConfig = MetricsConfig()
    logging: LoggingConfig = LoggingConfig()
    capacity: CapacityConfig = CapacityConfig()
    prefix: PrefixConfig = PrefixConfig()
    state: StateConfig = StateConfig()
    responses: ResponsesConfig = ResponsesConfig()
    pools: list[PoolConfig] = Field(default_factory=list)
    hosted_models: list[HostedModelConfig] = Field(default_factory=list)
    routes: list[RouteConfig] = Field(min_length=1)
    tenants: list[TenantConfig] = Field(default_factory=list)
    secrets: SecretsConfig = SecretsConfig()


def egress_problems(config: GatewayConfig) -> list[tuple[str, str]]:
    """URLs outside ``secrets.upstream_hosts``, and ``os.environ/`` names outside ``secrets.env``."""
    problems: list[tuple[str, str]] = []
    raw = config.model_dump()
    if config.secrets.upstream_hosts is not None:
        problems += url_problems(raw, config.secrets.upstream_hosts, default=False)
    if config.secrets.env is not None:
        problems += env_problems(raw, config.secrets.env)
    return problems


def reference_problems(config: GatewayConfig) -> list[tuple[str, str]]:
    """Names that do not resolve, as (field path, message): what pydantic cannot see field by field."""
    problems: list[tuple[str, str]] = egress_problems(config)
    targets = [p.name for p in config.pools] + [h.name for h in config.hosted_models]
    problems += _duplicates("pools/hosted_models", "pool or hosted model", targets)
    problems += _duplicates("routes", "route name or alias", [n for r in config.routes for n in (r.name, *r.aliases)])
    problems += _duplicates("tenants", "tenant", [t.name for t in config.tenants])
    problems += replica_name_problems(config)
    known = set(targets)
    tasks = {p.name: p.task for p in config.pools} | {h.name: h.task for h in config.hosted_models}
    for i, route in enumerate(config.routes):
        try:
            route.replica_policy()
        except PolicyParamError as exc:
            problems.append((f"routes.{i}.{exc.param}", exc.message))
        except KeyError as exc:
            problems.append((f"routes.{i}.weights", str(exc.args[0])))
        for j, target in enumerate(route.targets):
            if target not in known:
                problems.append((f"routes.{i}.targets.{j}", f"unknown target {target!r}; known: {sorted(known)}"))
        route_tasks = {tasks[t] for t in route.targets if t in tasks}
        if len(route_tasks) > 1:
            problems.append((f"routes.{i}.targets", "mixes embedding and generation targets (their 'task' differs)"))
    route_names = {n for r in config.routes for n in (r.name, *r.aliases)}
    pools = {p.name for p in config.pools}
    owner: dict[str, str] = {}
    for i, tenant in enumerate(config.tenants):
        for j, pattern in enumerate(tenant.routes):
            if pattern != "*" and pattern not in route_names:
                problems.append((f"tenants.{i}.routes.{j}", f"tenant {tenant.name!r} names unknown route {pattern!r}"))
        for j, pool in enumerate(tenant.dedicated_pools):
            where = f"tenants.{i}.dedicated_pools.{j}"
            if pool not in pools:
                problems.append((where, f"unknown pool {pool!r}"))
            elif pool in owner:
                problems.append((where, f"pool {pool!r} is already dedicated to tenant {owner[pool]!r}"))
            owner.setdefault(pool, tenant.name)
    for i, route in enumerate(config.routes):
        names = {route.name, *route.aliases}
        users = [
            t.name
            for t in config.tenants
            if t.isolation != "dedicated" and ("*" in t.routes or names.intersection(t.routes))
        ]
        if users and all(target in owner for target in route.targets):
            problems.append((f"routes.{i}.targets", f"every target is a dedicated pool: tenants {users} get nothing"))
    if config.auth.required and not config.tenants:
        problems.append(("auth.required", "auth.required is true but no tenants are configured"))
    return problems


def replica_name_problems(config: GatewayConfig) -> list[tuple[str, str]]:
    """A replica listed twice in its pool, and backend names taken twice: a name keys a backend's learned state,
    so two backends under one would share it."""
    problems: list[tuple[str, str]] = []
    owners: dict[str, str] = {}

    def claim(name: str, path: str, what: str) -> None:
        if name in owners:
            problems.append((path, f"{what} {name!r} is taken by {owners[name]}: rename one of them"))
        else:
            owners[name] = path

    for i, pool in enumerate(config.pools):
        addresses: dict[str, int] = {}
        for j, (replica, name) in enumerate(zip(pool.replicas, pool.replica_names(), strict=True)):
            where = f"pools.{i}.replicas.{j}"
            first = addresses.setdefault(replica.address, j)
            if first != j:
                problems.append(
                    (where, f"{replica.url} has the address of pools.{i}.replicas.{first}: list a replica once")
                )
            elif replica.name is not None:
                claim(name, f"{where}.name", "replica name")
            else:
                claim(name, where, "replica name (from its address)")
        for index, name in enumerate(pool.simulated_names()):
            claim(name, f"pools.{i}.simulated", f"simulated replica {index}'s name")
    for i, hosted in enumerate(config.hosted_models):
        claim(hosted.name, f"hosted_models.{i}.name", "hosted model name")
    return problems


def _duplicates(path: str, what: str, names: list[str]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    problems = []
    for name in names:
        if name in seen:
            problems.append((path, f"duplicate {what} {name!r}"))
        seen.add(name)
    return problems


class ConfigError(Exception):
    """A config that cannot be used; the message names the source, each field and what was expected."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []
        """Each problem as (field path, message), for the admin API to list."""

    @classmethod
    def listing(cls, problems: list[tuple[str, str]], prefix: str = "") -> ConfigError:
        """One error for several problems, each as ``path: message``."""
        return cls(prefix + "; ".join(f"{path}: {message}" for path, message in problems), problems)


def load_config(path: Path) -> GatewayConfig:
    """Read and validate ``path``; raise :class:`ConfigError` with every problem listed."""
    return parse_config(read_raw(path), source=str(path))


def read_raw(path: Path) -> object:
    """The YAML document in ``path``, not yet validated."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def parse_config(raw: object, *, source: str = "<config>") -> GatewayConfig:
    """Validate ``raw``; raise :class:`ConfigError` listing every problem by field path."""
    if not isinstance(raw, dict):
        problem = ("(top level)", f"expected a mapping at the top level, got {type(raw).__name__}")
        raise ConfigError(f"{source}: {problem[1]}", [problem])
    problems = non_json_problems(raw)
    if problems:
        raise ConfigError(_format(source, problems), problems)
    try:
        config = GatewayConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [(".".join(str(p) for p in e["loc"]) or "(top level)", e["msg"]) for e in exc.errors()]
        raise ConfigError(_format(source, problems), problems) from None
    problems = reference_problems(config)
    if problems:
        raise ConfigError(_format(source, problems), problems)
    return config


def _format(source: str, problems: list[tuple[str, str]]) -> str:
    lines = [f"{source}: {len(problems)} problem(s)"]
    lines += [f"  {path}: {message}" for path, message in problems]
    return "\n".join(lines)
