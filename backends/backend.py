"""One backend as the gateway knows it: its config, what probes learned, and the load on it.

Each part has one writer (docs/architecture.md, "Who writes which state"): the catalog writes the config, the
registry's probes and outlier detection write health and what the replica said, the dispatch ticket writes this
process's load (``own``) and what requests teach, and the peer exchange writes the other processes' (``peers``).
Policies never see this record: they get its immutable :meth:`Backend.state`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from spillgate.backends.engines import Engine, KvEventSource, ReplicaInfo, ReplicaLoad, engine_named
from spillgate.backends.load import OwnLoad, PeersLoad
from spillgate.backends.outlier import Breaker
from spillgate.backends.prefill_rate import PrefillRateEstimator
from spillgate.policies.types import BackendKind, BackendState

log = logging.getLogger("spillgate.backends")

_STATE_FIELDS = (
    "name",
    "kind",
    "healthy",
    "in_flight",
    "running",
    "queued",
    "token_usage",
    "cache_hit_rate",
    "max_total_tokens",
    "prefix_tokens",
    "pending_prefill_tokens",
    "prefill_tokens_per_s",
    "max_running",
    "mean_service_s",
    "tier",
    "context_window",
    "ttft_s",
    "tpot_s",
    "usd_per_mtok_in",
    "usd_per_mtok_out",
    "outstanding_tokens",
    "prefill_overhead_s",
    "external_load",
)
"""The order :meth:`Backend.state` lists its values in: a field added to, moved in or dropped from
:class:`~policies.types.BackendState` stops the gateway at import until ``state`` follows it."""
if BackendState._fields != _STATE_FIELDS:
    raise ImportError(f"Backend.state lists {_STATE_FIELDS}, BackendState has {BackendState._fields}")
_new_state = tuple.__new__


@dataclass(slots=True)
class Backend:
    """One backend as the gateway knows it right now."""

    name: str
    kind: BackendKind
    base_url: str
    served_model: str
    api_key: str | None = None
    """Sent as a bearer token: a hosted provider's key, or a replica's ``--api-key``."""
    engine: Engine = field(default_factory=lambda: engine_named("sglang"))
    """What kind of server a replica is: how to probe it and read its load (:mod:`backends.engines`)."""
    info: ReplicaInfo | None = None
    """What the replica said about itself when it registered; None until then, and again after a restart."""
    healthy: bool = True
    consecutive_failures: int = 0
    lost_connection: bool = False
    """A probe since the last good one could not connect at all: the process may have been restarted."""
    unhealthy_until: float = 0.0
    breaker: Breaker = field(default_factory=Breaker)
    """Passive outlier detection from real requests (:mod:`backends.outlier`): out while ejected, probes or not."""
    pool: str = ""
    """The pool a replica belongs to (its rent and rates); empty for a hosted model."""
    origin: str = "config"
    """Where a replica came from: ``config`` (the pool's ``replicas``), ``simulated`` or ``discovered`` (a source
    found it at run time: runtime state, never written into a config version)."""
    departed: bool = False
    """Gone from the catalog, still finishing requests sent before (drained): no new request picks it. Written by
    the registry."""
    kv_events: KvEventSource | None = None
    """Where its KV-cache events are published, when the config says (else the replica's own ``info`` does)."""
    kv_events_enabled: bool = True
    own: OwnLoad = field(default_factory=OwnLoad)
    """This process's requests here: written only by the dispatch ticket (:mod:`gateway.dispatch.ticket`)."""
    peers: PeersLoad = field(default_factory=PeersLoad)
    """The other gateway processes' requests here: written only by :mod:`gateway.dispatch.peer_load`."""
    prefill_tokens_per_s: float = 20000.0
    """The configured prior; ``prefill.rate`` is what routing uses once measurements exist."""
    max_running: int = 0
    prefill_batch_tokens: int = 0
    """New tokens one prefill batch takes (SGLang's ``chunked_prefill_size``); 0 when unknown."""
    max_waiting_prefill: int | None = None
    """Uncached prompt tokens that may wait unscheduled there before the gateway holds new prompts back
    (None: an eighth of a prefill batch; 0: never hold)."""
    mean_service_s: float = 0.0
    tier: int = 0
    context_window: int = 0
    usd_per_mtok_in: float = 0.0
    usd_per_mtok_out: float = 0.0
    ttft_s: float = 0.0
    """Recent TTFT (prior from config until measured)."""
    tpot_s: float = 0.0
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    external_load: int = 0
    """What the last scrape showed beyond the gateway's requests in flight, its other processes' included
    (see ``BackendState``)."""
    max_total_tokens: int = 0
    generation_failed: bool = False
    """The last generation check failed: the process answers but does not generate."""
    last_error: str = ""
    prefill: PrefillRateEstimator = field(init=False)
    request_headers: tuple[tuple[bytes, bytes], ...] = ()
    """Sent with every proxied request: content type, and the provider key for hosted models."""

    def __post_init__(self) -> None:
        self.prefill = PrefillRateEstimator(self.prefill_tokens_per_s)
        self.use_key(self.api_key)

    @property
    def hosted(self) -> bool:
        """A hosted model, billed by its provider per token: what tenants' hosted budgets count."""
        return self.kind == "hosted"

    def use_key(self, api_key: str | None) -> None:
        """Send ``api_key`` as a bearer token from now on, with requests and probes alike."""
        self.api_key = api_key
        headers = [(b"content-type", b"application/json")]
        if api_key:
            headers.append((b"authorization", f"Bearer {api_key}".encode()))
        self.request_headers = tuple(headers)

    def own_pending_prefill(self, now: float) -> int:
        """This process's uncached tokens here not yet computed: those before their first token, less what the
        batch under way has computed since it started (counted whole, a short queue behind a batch looks 1.5x
        as long)."""
        own = self.own
        pending = own.pending_prefill_tokens
        if own.running_prefill_tokens:
            done = (now - own.running_prefill_since) * self.prefill.rate
            pending -= min(own.running_prefill_tokens, int(done))
        return pending

    def state(self, now: float, prefix_tokens: int = 0) -> BackendState:
        """What policies see of this backend at ``now``: its own load and its peers' together."""
        load, own, peers = self.load, self.own, self.peers
        in_flight = own.in_flight + peers.in_flight
        pending = own.pending_prefill_tokens + peers.pending_prefill_tokens
        if own.running_prefill_tokens:  # own_pending_prefill, inlined: this runs per candidate per request
            done = (now - own.running_prefill_since) * self.prefill.rate
            pending -= min(own.running_prefill_tokens, int(done))
        # Positional, in _STATE_FIELDS order (checked against BackendState at import): built per candidate per
        # request, and binding 23 keywords costs twice as much as the whole rest of this method.
        return _new_state(
            BackendState,
            (
                self.name,  # name
                self.kind,  # kind
                self.healthy
                and now >= self.unhealthy_until
                and now >= self.breaker.ejected_until
                and not self.departed,  # healthy
                in_flight,  # in_flight
                load.running,  # running
                load.queued,  # queued
                load.token_usage,  # token_usage
                load.cache_hit_rate,  # cache_hit_rate
                self.max_total_tokens,  # max_total_tokens
                prefix_tokens,  # prefix_tokens
                pending,  # pending_prefill_tokens
                self.prefill.rate,  # prefill_tokens_per_s
                self.max_running,  # max_running
                self.mean_service_s,  # mean_service_s
                self.tier,  # tier
                self.context_window,  # context_window
                self.ttft_s,  # ttft_s
                self.tpot_s,  # tpot_s
                self.usd_per_mtok_in,  # usd_per_mtok_in
                self.usd_per_mtok_out,  # usd_per_mtok_out
                own.outstanding_tokens + peers.outstanding_tokens,  # outstanding_tokens
                self.prefill.busy_overhead_s if in_flight else self.prefill.overhead_s,  # prefill_overhead_s
                self.external_load,  # external_load
            ),
        )

    def observe_service_time(self, seconds: float) -> None:
        """Fold one finished request's end-to-end time into the recent mean."""
        self.mean_service_s = _ewma(self.mean_service_s, seconds)

    def observe_usage(self, usage: Mapping[str, object]) -> None:
        """Learn from a response whether the replica reports cached tokens (a vLLM replica does not say so before)."""
        info = self.info
        if info is None or self.kind != "replica":
            return
        details = usage.get("prompt_tokens_details")
        reported = isinstance(details, Mapping) and isinstance(details.get("cached_tokens"), int)
        if info.cache_report is None or info.cache_report != reported:
            missing = [m for m in info.missing if not m.startswith(_CACHE_REPORT)]
            flag = self.engine.cache_report_flag
            if not reported:
                missing.append(f"{_CACHE_REPORT}: start the server with {flag}" if flag else _CACHE_REPORT)
                log.warning("replica %s reports no cached tokens: %s", self.name, missing[-1])
            self.info = replace(info, cache_report=reported, missing=tuple(missing))

    def observe_latency(self, ttft_s: float | None, tpot_s: float | None) -> None:
        """Fold a streamed request's TTFT and TPOT into the recent means (what hosted decisions predict from)."""
        if ttft_s is not None:
            self.ttft_s = _ewma(self.ttft_s, ttft_s)
        if tpot_s is not None:
            self.tpot_s = _ewma(self.tpot_s, tpot_s)


_CACHE_REPORT = "cached-token feedback to the prefix index"


def _ewma(current: float, sample: float, weight: float = 0.1) -> float:
    return sample if not current else (1 - weight) * current + weight * sample
