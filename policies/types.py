"""The values a routing decision is made from, the decision itself (plain, immutable data), and the one
interface every policy offers the gateway (:class:`Decider`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

BackendKind = Literal["replica", "hosted"]


class RouteRequest(NamedTuple):
    """What the policy may know about one request; built by the gateway before routing.

    Named tuples rather than frozen dataclasses: as immutable, and several times cheaper to build, which
    matters because one is built per request and one ``BackendState`` per candidate per request.
    """

    tenant: str
    route: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    sequence: int = 0
    """A per-route counter the gateway assigns, so rotating policies stay pure functions."""
    prefix_key: int = 0
    """Hash of the prompt's first prefix blocks (0 when too short), for prefix-affine hashing."""
    required_tier: int = 0
    """Quality tier the prompt needs (from the complexity classifier); 0 accepts any backend."""
    ttft_slo_s: float = float("inf")
    tpot_slo_s: float = float("inf")
    self_hosted_only: bool = False
    """The tenant's residency rule: this request may never leave our GPUs."""
    hosted_allowed: bool = True
    """False when the tenant's hosted budget is spent."""
    spilling: bool = False
    """The route spilled its last overflow decision; it keeps spilling until replicas are clearly back."""
    chat: bool = True
    """A chat request; hosted models are reached through a chat-only client."""
    priority: int = 1
    """The tenant's claim on paid capacity under pressure: 0 low (never spills for overflow), 1 normal,
    2 high (takes the fastest candidate when nothing meets the SLO, whatever ``on_slo_miss`` says)."""


class BackendState(NamedTuple):
    """One candidate backend as last observed: scraped figures plus the gateway's own in-flight count.

    "The gateway" is every process of it that shares its load through Redis (:mod:`gateway.dispatch.peer_load`): this
    process's counts, exact, plus the others' as they last said them."""

    name: str
    kind: BackendKind
    healthy: bool = True
    in_flight: int = 0
    running: int = 0
    queued: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    max_total_tokens: int = 0
    prefix_tokens: int = 0
    """How many leading prompt tokens this backend probably holds in its prefix cache (from the index)."""
    pending_prefill_tokens: int = 0
    """Uncached prompt tokens the gateway sent here that have not produced a first token yet."""
    prefill_tokens_per_s: float = 20000.0
    max_running: int = 0
    """Requests the replica runs at once (SGLang's ``max_running_requests``); 0 when unknown."""
    mean_service_s: float = 0.0
    """Recent mean end-to-end time of requests the gateway sent here."""
    tier: int = 0
    """Quality tier: higher serves harder prompts (open model 1, frontier 2, by config)."""
    context_window: int = 0
    """Largest prompt + output this backend accepts; 0 when unknown."""
    ttft_s: float = 0.0
    """Measured recent TTFT (hosted backends, whose queues we cannot see)."""
    tpot_s: float = 0.0
    """Measured recent time per output token."""
    usd_per_mtok_in: float = 0.0
    usd_per_mtok_out: float = 0.0
    outstanding_tokens: int = 0
    """Output tokens still to come for the requests the gateway has in flight here (by their max_tokens)."""
    prefill_overhead_s: float = 0.0
    """Measured fixed time to a first token on top of the prefill itself (scheduling, a pass's floor, network),
    as the replica is now: idle, or decoding others (whose pass in progress a new request waits for)."""
    external_load: int = 0
    """Requests the replica reported (running and queued) at its last scrape beyond those the gateway had in
    flight there then: other clients' load, which the gateway's own count cannot see."""

    @property
    def load(self) -> int:
        """Requests this backend is busy with: ours in flight now, plus other clients' as last scraped.

        Not the scraped running and queued counts themselves: they are up to a probe interval old and,
        where the gateway is the replica's only client, are its own requests, some answered since."""
        return self.in_flight + self.external_load


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The candidates of one route at one moment."""

    backends: tuple[BackendState, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and why; ``reason`` becomes the ``x-spillgate-reason`` header."""

    backend: str
    reason: str
    ranked: tuple[str, ...] = ()
    """Every candidate in preference order, so a failed attempt can fall back to the next."""
    predicted_ttft_s: float = 0.0
    predicted_cost_usd: float = 0.0


class Decider(Protocol):
    """What the gateway asks of a route's policy, plain (:class:`~policies.engine.Policy`) or hybrid
    (:class:`~policies.spill.HybridPolicy`): one decision per request, and whether to fingerprint prompts."""

    @property
    def uses_prefix(self) -> bool:
        """Whether decisions read prefix-cache state, so the gateway fingerprints prompts only when needed."""
        ...

    def decide(self, request: RouteRequest, snapshot: Snapshot) -> Decision:
        """The backend for ``request`` among ``snapshot``'s, with the rest ranked for fallback; raises
        :class:`NoCandidate`, :class:`Unservable` or :class:`OverCapacity` when none may take it."""
        ...


class NoCandidate(Exception):
    """No backend passes the filters; the gateway answers 503."""


class Unservable(NoCandidate):
    """Healthy backends exist, but none may ever serve this request (its endpoint, its tenant's residency, its
    length): the client's to change, not a wait."""


class OverCapacity(Exception):
    """Candidates exist but none can meet the SLO and the route says to refuse: the gateway answers 429."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
