"""The filters, scorers and pickers that policies are assembled from."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter

import xxhash

from spillgate.policies.prediction import Candidates
from spillgate.policies.types import BackendState, RouteRequest


@dataclass(frozen=True, slots=True)
class HealthyFilter:
    """Drops backends whose health checks fail."""

    def keep(self, request: RouteRequest, backend: BackendState) -> bool:
        return backend.healthy


@dataclass(frozen=True, slots=True)
class LeastLoadScorer:
    """Prefers the backend with the fewest requests, relative to the busiest one: ours in flight there, plus
    other clients' as last scraped (:attr:`~policies.types.BackendState.load`).

    In ``cache_aware`` it weighs in where a new prefix settles: the requests a replica holds now are the
    conversations and prompt groups that will come back to it, which its pending prefill alone does not show.
    """

    def scores(self, request: RouteRequest, candidates: Candidates) -> list[float]:
        # BackendState.load, inlined: this runs per candidate per request.
        loads = [b.in_flight + b.external_load for b in candidates.backends]
        busiest = max(loads)
        if not busiest:
            return [1.0] * len(loads)
        return [1.0 - load / busiest for load in loads]


@dataclass(frozen=True, slots=True)
class PredictedTTFTScorer:
    """Prefers the lowest predicted TTFT plus the prefill work the choice costs everyone else.

    TTFT alone is greedy: under load a cold replica with a slightly shorter queue wins, and the cluster
    pays for recomputing a prefix it already holds (and the conversation's next turns miss too). Charging
    ``work_weight`` x the uncached prefill time as well keeps requests on warm replicas until the queue
    there really costs more. In ``cache_aware`` the :class:`PrefixAffinityScorer` decides warm against cold;
    this scorer places cold prompts and orders the fallbacks.

    Costs within ``resolution_s`` of the best count as the best. Below about one forward pass a difference is
    the noise of fitted overheads (one replica measured, its sibling not yet), not a reason to settle every new
    prefix on one idle replica: equal choices rotate instead, as the picker intends.
    """

    work_weight: float = 1.0
    resolution_s: float = 0.01

    def scores(self, request: RouteRequest, candidates: Candidates) -> list[float]:
        prompt = request.prompt_tokens
        work_weight = self.work_weight
        costs = [
            ttft + work_weight * (prompt - b.prefix_tokens if prompt > b.prefix_tokens else 0) / b.prefill_tokens_per_s
            for ttft, b in zip(candidates.predicted_ttfts(), candidates.backends, strict=True)
        ]
        best = min(costs)
        # Shifted down by the resolution, never below the best: the score stays continuous past the tie band.
        floor = best + self.resolution_s
        return [1.0 if c <= floor else best / (c - self.resolution_s) for c in costs]


@dataclass(frozen=True, slots=True)
class PrefixAffinityScorer:
    """Keeps a request with the replicas holding its longest cached prefix, unless their queues are far worse.

    1.0 for the replicas holding (within ``slack_tokens``) the longest prefix of the prompt, 0.0 for the
    others; no preference (all 0.0) when that prefix is under ``min_share`` of the prompt, or when the best
    warm replica's predicted TTFT is more than ``max_slowdown`` times the best cold one's (which includes
    prefilling the whole prompt). Weighted above all the other scorers together, it makes affinity a rule
    with a load guard, as sglang-router's cache_aware is with its balance thresholds, but judged in
    predicted seconds rather than request counts.

    Why a rule and not a trade-off against queue length: moving a conversation or a prompt group to a cold
    replica recomputes its prefix, and at 60-80% busy that work lands in a queue too. Measured on
    ``tests.bench.compare_routers``: moves at a 3x slowdown cost chat 3-4 points of hit rate
    (37% against 40.3%, the best achievable) and did not lower TTFT p99 beyond run-to-run noise; over 8 s
    they cut chat TTFT p99 from ~890 to ~650 ms but the extra prefill stalled decoding (TPOT p99 71 ms,
    goodput 74 -> 61/s). Since predictions count the batch under way, a 2x guard moves only turns stuck behind
    a real backlog: on replicas with SGLang's defaults it cut chat's TTFT p99 by 15-17% at 61-73% busy for at
    most 1.6% of the best hit rate, with the same goodput, and left gsp alone (docs/performance.md). That is
    the defaults' rule: goodput first, then TTFT p99, giving up at most 2% of the best achievable hit rate.
    """

    min_share: float = 0.25
    max_slowdown: float = 2.0
    slack_tokens: int = 64

    def scores(self, request: RouteRequest, candidates: Candidates) -> list[float]:
        prefixes = [b.prefix_tokens for b in candidates.backends]
        longest = max(prefixes)
        if longest <= 0 or longest < self.min_share * request.prompt_tokens:
            return [0.0] * len(prefixes)
        floor = longest - self.slack_tokens
        affinity = [1.0 if prefix >= floor else 0.0 for prefix in prefixes]
        if 0.0 not in affinity:
            return affinity  # every candidate is warm
        ttfts = candidates.predicted_ttfts()
        limit = min([ttft for ttft, warm in zip(ttfts, affinity, strict=True) if warm]) / self.max_slowdown
        # Move only if some cold replica, prefilling the whole prompt, still beats the limit.
        if min([ttft for ttft, warm in zip(ttfts, affinity, strict=True) if not warm]) < limit:
            return [0.0] * len(prefixes)
        return affinity


@dataclass(frozen=True, slots=True)
class PrefixHitScorer:
    """Prefers the backend holding more of the prompt: a tie-breaker that keeps equal-TTFT choices warm."""

    def scores(self, request: RouteRequest, candidates: Candidates) -> list[float]:
        total = max(1, request.prompt_tokens)
        # min(1.0, share), inlined: a share rounds to 1.0 only where it would have been capped to 1.0 anyway.
        return [1.0 if b.prefix_tokens >= total else b.prefix_tokens / total for b in candidates.backends]


@dataclass(frozen=True, slots=True)
class BestScorePicker:
    """Highest score first; ties rotate with the request's sequence number so equal backends share work."""

    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]:
        scored = list(scored)
        shift = request.sequence % len(scored)
        rotated = scored[shift:] + scored[:shift]
        # sorted() is stable, reverse=True included, so equal scores keep the rotated order.
        return [backend for _, backend in sorted(rotated, key=_score, reverse=True)]


_score = itemgetter(0)


@dataclass(frozen=True, slots=True)
class RotatingPicker:
    """Round robin: the request's sequence number chooses, whatever the scores."""

    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]:
        count = len(scored)
        return [scored[(i + request.sequence) % count][1] for i in range(count)]


@dataclass(frozen=True, slots=True)
class PowerOfTwoPicker:
    """Two candidates drawn by the request's sequence number; the less loaded one goes first."""

    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]:
        backends = [b for _, b in scored]
        if len(backends) < 2:
            return backends
        draw = xxhash.xxh3_64_intdigest(request.sequence.to_bytes(8, "little"))
        first = draw % len(backends)
        second = (first + 1 + (draw >> 32) % (len(backends) - 1)) % len(backends)
        pair = sorted((backends[first], backends[second]), key=lambda b: b.load)
        return pair + [b for b in backends if b not in pair]


@dataclass(frozen=True, slots=True)
class ConsistentHashPicker:
    """The backend owning the prompt's leading prefix on a hash ring: affinity without any shared state."""

    virtual_nodes: int = 64

    def rank(self, request: RouteRequest, scored: Sequence[tuple[float, BackendState]]) -> list[BackendState]:
        by_name = {b.name: b for _, b in scored}
        points, owners = _hash_ring(tuple(by_name), self.virtual_nodes)
        start = bisect.bisect(points, request.prefix_key)
        ordered: list[str] = []
        for offset in range(len(owners)):
            name = owners[(start + offset) % len(owners)]
            if name not in ordered:
                ordered.append(name)
                if len(ordered) == len(by_name):
                    break
        return [by_name[name] for name in ordered]


@functools.lru_cache(maxsize=256)
def _hash_ring(names: tuple[str, ...], virtual_nodes: int) -> tuple[list[int], list[str]]:
    """Ring positions and their owners; memoized because candidate sets repeat request after request."""
    nodes = sorted(
        (xxhash.xxh3_64_intdigest(f"{name}#{i}".encode()), name) for name in names for i in range(virtual_nodes)
    )
    return [point for point, _ in nodes], [name for _, name in nodes]


@dataclass(frozen=True, slots=True)
class PrefixReason:
    """``prefix_hit`` when the chosen backend already holds part of the prompt, else ``fallback_reason``."""

    fallback_reason: str

    def reason(self, request: RouteRequest, chosen: BackendState) -> str:
        return "prefix_hit" if chosen.prefix_tokens > 0 else self.fallback_reason
