"""Hybrid routing: self-hosted replicas and hosted models are candidates alike.

The rule follows from what each choice costs at the margin. The replicas' rent is paid whether they are busy
or not, so a replica request costs only the GPU time it takes from other requests. While the best replica is
predicted to meet the tenant's SLO, that time is spare and costs nothing: the replica wins over any hosted
price. When it is predicted to miss, the time is taken from requests already queued there and the request
misses its own target, and a hosted call is the price of avoiding both: the request spills (``overflow``), to
the cheapest hosted model predicted to meet the SLO. A prompt that needs a quality tier no replica has
spills whatever the load (``complex``): a cheap wrong answer is not cheaper. Residency and budget can forbid
hosted candidates; when that changes the outcome the decision says so (``residency``, ``budget``), and a
low-priority tenant waits rather than buy overflow capacity (``priority``). After a failure the next
candidate serves as a ``fallback``. Hysteresis: once a route spills, replicas must be predicted comfortably
inside the SLO (``hysteresis`` x target) before traffic returns to them, so a pool near its limit does not
flap. Replicas are ranked among themselves by the route's replica policy (``cache_aware`` by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from spillgate.policies.prediction import predicted_ttft
from spillgate.policies.types import (
    BackendState,
    Decider,
    Decision,
    NoCandidate,
    OverCapacity,
    RouteRequest,
    Snapshot,
    Unservable,
)

OnSloMiss = Literal["fastest", "queue", "reject"]
_DEFAULT_OUTPUT_TOKENS = 256
"""Output length assumed for cost when the request sets no ``max_tokens``."""


@dataclass(frozen=True, slots=True)
class Prediction:
    backend: BackendState
    ttft_s: float
    tpot_s: float
    cost_usd: float

    def meets(self, request: RouteRequest, scale: float = 1.0) -> bool:
        return self.ttft_s <= request.ttft_slo_s * scale and self.tpot_s <= request.tpot_slo_s * scale


def predict(request: RouteRequest, backend: BackendState) -> Prediction:
    """TTFT, TPOT and cost of serving ``request`` on ``backend``."""
    if backend.kind == "replica":
        ttft = predicted_ttft(request, backend)
        # TPOT grows with the batch: a replica with nothing in flight will decode at its best, whatever the
        # recent average says (and while a route spills, that average gets no new evidence).
        tpot = backend.tpot_s if backend.in_flight else 0.0
    else:
        ttft, tpot = backend.ttft_s, backend.tpot_s
    uncached = max(0, request.prompt_tokens - backend.prefix_tokens)
    output = request.max_tokens or _DEFAULT_OUTPUT_TOKENS
    cost = (uncached * backend.usd_per_mtok_in + output * backend.usd_per_mtok_out) / 1e6
    return Prediction(backend, ttft, tpot, cost)


def allowed(request: RouteRequest, backend: BackendState) -> bool:
    """Health, residency, budget and context window: what may serve this request at all."""
    if not backend.healthy:
        return False
    if backend.kind == "hosted" and (request.self_hosted_only or not request.hosted_allowed or not request.chat):
        return False
    return not backend.context_window or request.prompt_tokens + request.max_tokens <= backend.context_window


def _never_serves(request: RouteRequest, backend: BackendState) -> str | None:
    """Why a healthy ``backend`` may never serve ``request``, whatever the load; ``None`` if it may (or only
    a spent hosted budget keeps it out, which the gateway answers as a quota)."""
    if backend.kind == "hosted" and not request.chat:
        return "its hosted models serve /v1/chat/completions only"
    if backend.kind == "hosted" and request.self_hosted_only:
        return "this tenant's requests may not leave the self-hosted replicas"
    if backend.context_window and request.prompt_tokens + request.max_tokens > backend.context_window:
        return (
            f"the prompt (~{request.prompt_tokens} tokens) plus max_tokens ({request.max_tokens}) exceed "
            f"the context window ({backend.context_window} tokens)"
        )
    return None


LOW_PRIORITY, HIGH_PRIORITY = 0, 2


@dataclass(frozen=True)
class HybridPolicy:
    """Replicas ranked by ``replicas``, hosted models by cost, and the SLO deciding between them: a
    :class:`~policies.types.Decider` wrapping another."""

    name: str
    replicas: Decider
    on_slo_miss: OnSloMiss = "fastest"
    hysteresis: float = 0.8

    @property
    def uses_prefix(self) -> bool:
        return self.replicas.uses_prefix

    def decide(self, request: RouteRequest, snapshot: Snapshot) -> Decision:
        candidates = [b for b in snapshot.backends if allowed(request, b)]
        if not candidates:
            reasons = [_never_serves(request, b) for b in snapshot.backends if b.healthy]
            if reasons and all(reasons):
                raise Unservable("; ".join(dict.fromkeys(r for r in reasons if r)))
            raise NoCandidate(f"no healthy backend for route {request.route!r}")
        replica_decision, replicas = self._rank_replicas(request, candidates)
        hosted = sorted(
            (predict(request, b) for b in candidates if b.kind == "hosted"), key=lambda p: (p.cost_usd, p.ttft_s)
        )
        capable_replicas = [p for p in replicas if p.backend.tier >= request.required_tier]
        capable_hosted = [p for p in hosted if p.backend.tier >= request.required_tier]
        scale = self.hysteresis if request.spilling else 1.0

        if capable_replicas and capable_replicas[0].meets(request, scale):
            return _decision(capable_replicas[0], replica_decision.reason, capable_replicas, hosted)
        if not any(b.kind == "replica" for b in snapshot.backends):
            why = "hosted"  # a hosted-only route: nothing spilled
        else:
            why = "complex" if not capable_replicas else "overflow"
        if why == "overflow" and request.priority == LOW_PRIORITY and any(b.kind == "hosted" for b in candidates):
            return self._keep_low_priority(request, capable_replicas, hosted)
        meeting = [p for p in capable_hosted if p.meets(request)]
        if meeting:
            return _decision(meeting[0], why, meeting, [*capable_hosted, *replicas])
        if not capable_replicas and not capable_hosted:
            # Nothing reaches the tier (residency or budget ruled hosted out, or no backend is that good):
            # best effort on what remains, replicas first.
            remaining = replicas or hosted
            return _decision(remaining[0], self._forbidden_reason(request, snapshot, "complex"), remaining, [])
        return self._on_miss(request, snapshot, capable_replicas, capable_hosted, why)

    def _rank_replicas(
        self, request: RouteRequest, candidates: Sequence[BackendState]
    ) -> tuple[Decision, list[Prediction]]:
        replicas = [b for b in candidates if b.kind == "replica"]
        if not replicas:
            return Decision(backend="", reason="hosted"), []
        decision = self.replicas.decide(request, Snapshot(tuple(replicas)))
        by_name = {b.name: b for b in replicas}
        return decision, [predict(request, by_name[name]) for name in decision.ranked]

    def _on_miss(
        self,
        request: RouteRequest,
        snapshot: Snapshot,
        replicas: list[Prediction],
        hosted: list[Prediction],
        why: str,
    ) -> Decision:
        if self.on_slo_miss == "reject" and request.priority < HIGH_PRIORITY:
            soonest = min(p.ttft_s for p in [*replicas, *hosted])
            raise OverCapacity(f"no backend for {request.route!r} is predicted to meet the SLO", soonest)
        if self.on_slo_miss == "queue" and replicas and request.priority < HIGH_PRIORITY:
            return _decision(replicas[0], self._forbidden_reason(request, snapshot, "queued"), replicas, hosted)
        fastest = min([*replicas, *hosted], key=lambda p: p.ttft_s)
        if fastest.backend.kind == "hosted":
            return _decision(fastest, why, hosted, replicas)
        return _decision(fastest, self._forbidden_reason(request, snapshot, "best_effort"), replicas, hosted)

    def _keep_low_priority(
        self, request: RouteRequest, replicas: list[Prediction], hosted: list[Prediction]
    ) -> Decision:
        """Paid overflow capacity is not for low-priority tenants: they wait on the replicas (or are refused
        when the route rejects what misses the SLO)."""
        if self.on_slo_miss == "reject":
            soonest = min(p.ttft_s for p in replicas)
            raise OverCapacity(f"{request.route!r} is over capacity for low-priority requests", soonest)
        return _decision(replicas[0], "priority", replicas, hosted)

    @staticmethod
    def _forbidden_reason(request: RouteRequest, snapshot: Snapshot, otherwise: str) -> str:
        """Name the rule that kept a request on our replicas when a hosted model could have taken it."""
        if any(b.kind == "hosted" and b.healthy for b in snapshot.backends):
            if request.self_hosted_only:
                return "residency"
            if not request.hosted_allowed:
                return "budget"
            if not request.chat:
                return "endpoint"
        return otherwise


def _decision(chosen: Prediction, reason: str, same_kind: list[Prediction], others: list[Prediction]) -> Decision:
    ranked = [chosen.backend.name]
    for prediction in [*same_kind, *others]:
        if prediction.backend.name not in ranked:
            ranked.append(prediction.backend.name)
    return Decision(
        backend=chosen.backend.name,
        reason=reason,
        ranked=tuple(ranked),
        predicted_ttft_s=chosen.ttft_s,
        predicted_cost_usd=chosen.cost_usd,
    )
