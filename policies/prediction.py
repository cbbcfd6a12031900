"""Per-candidate predictions that several scorers read, computed once per decision.

Kept apart from the plug-ins so the engine's scorer protocol and the hybrid policy can use them without
depending on any particular scorer.
"""

from __future__ import annotations

from spillgate.policies.types import BackendState, RouteRequest


def predicted_ttft(request: RouteRequest, backend: BackendState) -> float:
    """Seconds to the first token on ``backend``: waiting for a slot, prefill queued ahead, our uncached prompt.

    Prefill ahead is the gateway's own count of uncached prompt tokens still in prefill there (fresh and
    exact for our traffic); rate and fixed overhead are fitted to observed TTFTs against that same count
    (:mod:`backends.prefill_rate`). A request beyond the replica's running slots (ours in flight there, plus
    other clients' as last scraped) waits for a running one to finish: the mean remaining output of the
    requests in flight there, at the replica's measured time per output token, shared over its slots.
    """
    uncached = max(0, request.prompt_tokens - backend.prefix_tokens)
    prefill = backend.prefill_overhead_s + (backend.pending_prefill_tokens + uncached) / backend.prefill_tokens_per_s
    if backend.max_running:
        # Ahead for a slot: ours in flight now (a fresh count), plus other clients' requests as last scraped.
        # Not the scraped queue itself: it is up to a probe interval old, and mostly ours, answered since.
        over = backend.in_flight + backend.external_load + 1 - backend.max_running
    else:
        over = backend.queued
    if over <= 0:
        return prefill
    if backend.tpot_s and backend.in_flight:
        remaining_s = backend.outstanding_tokens / backend.in_flight * backend.tpot_s
    else:
        remaining_s = backend.mean_service_s
    return prefill + over * remaining_s / max(1, backend.max_running)


class Candidates:
    """The backends one decision chooses among, and per-backend figures that several scorers read.

    The affinity guard and the TTFT scorer both need every candidate's predicted TTFT: computed here once per
    decision, on first use, rather than once per scorer. Still a pure function of the request and the snapshot.
    """

    __slots__ = ("_ttfts", "backends", "request")

    def __init__(self, request: RouteRequest, backends: list[BackendState]) -> None:
        self.request = request
        self.backends = backends
        self._ttfts: list[float] | None = None

    def predicted_ttfts(self) -> list[float]:
        """:func:`predicted_ttft` of each backend, in order."""
        if self._ttfts is None:
            request = self.request
            self._ttfts = [predicted_ttft(request, b) for b in self.backends]
        return self._ttfts
