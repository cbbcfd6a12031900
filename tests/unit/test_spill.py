"""Hybrid decisions: replicas first while they meet the SLO; spill reasons; residency, budget, hysteresis."""

from __future__ import annotations

import pytest

from spillgate.policies.registry import build_policy
from spillgate.policies.spill import HybridPolicy
from spillgate.policies.types import BackendState, NoCandidate, OverCapacity, RouteRequest, Snapshot, Unservable

SLO = 1.0


def request(**changes: object) -> RouteRequest:
    base = RouteRequest("t", "chat", prompt_tokens=2000, max_tokens=200, stream=True, ttft_slo_s=SLO, tpot_slo_s=0.05)
    return base._replace(**changes)


def replica(name: str, *, pending: int = 0, tier: int = 1, healthy: bool = True) -> BackendState:
    return BackendState(
        name,
        "replica",
        healthy,
        pending_prefill_tokens=pending,
        prefill_tokens_per_s=20_000,
        tier=tier,
        tpot_s=0.02,
        usd_per_mtok_out=0.5,
        context_window=131072,
    )


def hosted(name: str, *, ttft: float = 0.4, price_out: float = 15.0, tier: int = 2) -> BackendState:
    return BackendState(
        name,
        "hosted",
        ttft_s=ttft,
        tpot_s=0.015,
        tier=tier,
        usd_per_mtok_in=3.0,
        usd_per_mtok_out=price_out,
        context_window=200_000,
    )


def policy(on_miss: str = "fastest") -> HybridPolicy:
    return HybridPolicy("hybrid", build_policy("cache_aware"), on_slo_miss=on_miss)  # type: ignore[arg-type]


IDLE = Snapshot((replica("r0"), replica("r1"), hosted("frontier")))
BUSY = Snapshot((replica("r0", pending=60_000), replica("r1", pending=80_000), hosted("frontier")))


def test_replicas_serve_while_they_meet_the_slo() -> None:
    decision = policy().decide(request(), IDLE)
    assert decision.backend in {"r0", "r1"}
    assert decision.reason == "least_ttft"
    assert decision.ranked[-1] == "frontier", "hosted stays available as the last fallback"


def test_overflow_spills_to_the_cheapest_hosted_model_meeting_the_slo() -> None:
    snapshot = Snapshot((*BUSY.backends, hosted("pricey", price_out=60.0), hosted("slow", ttft=5.0, price_out=1.0)))
    decision = policy().decide(request(), snapshot)
    assert (decision.backend, decision.reason) == ("frontier", "overflow")
    assert decision.predicted_cost_usd == pytest.approx((2000 * 3.0 + 200 * 15.0) / 1e6)


def test_complex_prompts_need_the_tier() -> None:
    decision = policy().decide(request(required_tier=2), IDLE)
    assert (decision.backend, decision.reason) == ("frontier", "complex")


def test_residency_keeps_requests_on_our_gpus_even_when_overloaded_or_complex() -> None:
    assert policy().decide(request(self_hosted_only=True), BUSY).reason == "residency"
    decision = policy().decide(request(self_hosted_only=True, required_tier=2), IDLE)
    assert decision.backend.startswith("r") and decision.reason == "residency"
    assert "frontier" not in decision.ranked


def test_spent_budget_keeps_requests_on_replicas() -> None:
    decision = policy().decide(request(hosted_allowed=False), BUSY)
    assert decision.backend == "r0" and decision.reason == "budget"


def test_hysteresis_keeps_spilling_until_replicas_are_clearly_back() -> None:
    # 17,000 pending + 2,000 own tokens at 20,000/s = 0.95 s: inside the SLO, but not by the margin.
    snapshot = Snapshot((replica("r0", pending=17_000), hosted("frontier")))
    assert policy().decide(request(spilling=False), snapshot).backend == "r0"
    assert policy().decide(request(spilling=True), snapshot).backend == "frontier"
    relaxed = Snapshot((replica("r0", pending=10_000), hosted("frontier")))
    assert policy().decide(request(spilling=True), relaxed).backend == "r0"


def test_when_nothing_meets_the_slo_the_route_decides() -> None:
    snapshot = Snapshot((replica("r0", pending=80_000), hosted("frontier", ttft=3.5)))  # r0: 4.1 s
    assert policy("fastest").decide(request(), snapshot).backend == "frontier"
    queued = policy("queue").decide(request(), snapshot)
    assert (queued.backend, queued.reason) == ("r0", "queued")
    with pytest.raises(OverCapacity) as refused:
        policy("reject").decide(request(), snapshot)
    assert refused.value.retry_after_s == pytest.approx(3.5)


def test_context_window_and_health_filter_candidates() -> None:
    small = replica("r0")._replace(context_window=1000)
    decision = policy().decide(request(), Snapshot((small, replica("r1", healthy=False), hosted("frontier"))))
    assert decision.backend == "frontier"


def test_low_priority_waits_instead_of_spilling_for_overflow() -> None:
    decision = policy().decide(request(priority=0), BUSY)
    assert (decision.backend, decision.reason) == ("r0", "priority")
    with pytest.raises(OverCapacity):
        policy("reject").decide(request(priority=0), BUSY)
    # Complexity is about quality, not capacity: a complex prompt still goes to the tier that can answer it.
    assert policy().decide(request(priority=0, required_tier=2), IDLE).reason == "complex"


def test_high_priority_takes_the_fastest_whatever_the_route_says() -> None:
    snapshot = Snapshot((replica("r0", pending=80_000), hosted("frontier", ttft=3.5)))  # nothing meets 1 s
    assert policy("reject").decide(request(priority=2), snapshot).backend == "frontier"
    assert policy("queue").decide(request(priority=2), snapshot).backend == "frontier"


def test_a_hosted_only_route_is_not_a_spill() -> None:
    decision = policy().decide(request(), Snapshot((hosted("frontier"),)))
    assert (decision.backend, decision.reason) == ("frontier", "hosted")


def test_a_hosted_only_route_below_the_tier_serves_best_effort() -> None:
    """No backend reaches the tier the prompt needs: the cheapest hosted model still answers."""
    snapshot = Snapshot((hosted("small", tier=1, price_out=2.0), hosted("mid", tier=1, price_out=4.0)))
    decision = policy().decide(request(required_tier=2), snapshot)
    assert (decision.backend, decision.ranked) == ("small", ("small", "mid"))


def test_no_healthy_backend_is_a_wait_but_one_that_may_never_serve_is_the_clients_to_change() -> None:
    hosted_only = Snapshot((hosted("frontier"),))
    with pytest.raises(Unservable, match="/v1/chat/completions only"):
        policy().decide(request(chat=False), hosted_only)
    with pytest.raises(Unservable, match="may not leave the self-hosted replicas"):
        policy().decide(request(self_hosted_only=True), hosted_only)
    with pytest.raises(Unservable, match="context window"):
        policy().decide(request(prompt_tokens=300_000), IDLE)
    down = Snapshot((replica("r0", healthy=False), hosted("frontier")._replace(healthy=False)))
    with pytest.raises(NoCandidate) as waited:
        policy().decide(request(chat=False), down)
    assert not isinstance(waited.value, Unservable), "nothing healthy: a wait, answered 503 with Retry-After"
    with pytest.raises(NoCandidate) as budget:
        policy().decide(request(hosted_allowed=False), hosted_only)
    assert not isinstance(budget.value, Unservable), "a spent hosted budget is a quota, not the request's fault"


def test_a_completions_request_that_needs_the_hosted_tier_says_why_it_stays() -> None:
    decision = policy().decide(request(chat=False, required_tier=2), IDLE)
    assert decision.backend.startswith("r") and decision.reason == "endpoint"
    assert "frontier" not in decision.ranked
