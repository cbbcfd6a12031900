"""What a finished request leaves behind: its metrics, its price, and its ledger entry.

Kept apart from the hot path in :mod:`gateway.serving.forwarding`, which calls :func:`book_dispatch` before a request is
sent, and :func:`price_cut_off`, :func:`record_outcome` and then :func:`book_ledger` once it ends, whatever its
outcome: the price the first two set is what the third books, so the spend metrics and the ledger agree.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from spillgate.backends.registry import BackendRegistry
from spillgate.gateway.accounting import Accountant, LedgerEntry, Reservation
from spillgate.gateway.accounting.rent import RentBook
from spillgate.gateway.observability.metrics import ALL_TENANTS, GatewayMetrics
from spillgate.gateway.serving.exchange import Attempt
from spillgate.gateway.serving.validation import ParsedRequest
from spillgate.policies.prediction import predicted_ttft


def record_outcome(metrics: GatewayMetrics, attempt: Attempt, rent: RentBook, *, tenant_labels: bool) -> None:
    """Count the request, and for a served one its latencies, tokens, spend, GPU time and SLO result.

    ``tenant_labels`` (the config's ``metrics.tenant_labels``): label spend by tenant rather than one total."""
    metrics.requests.labels(attempt.route, attempt.backend, attempt.outcome, attempt.reason).inc()
    tenant = attempt.tenant.name if attempt.tenant and tenant_labels else ALL_TENANTS
    if attempt.outcome != "ok":
        _count_spend(metrics, attempt, tenant, rent)  # what a request cut off costs still counts
        return
    metrics.e2e.labels(attempt.backend).observe(time.perf_counter() - attempt.started)
    _count_prompt_tokens(metrics, attempt)
    _count_spend(metrics, attempt, tenant, rent)
    if attempt.first_token_at:
        metrics.ttft.labels(attempt.backend).observe(attempt.first_token_at - attempt.started)
        _judge_prediction(metrics, attempt)
    _count_slo(metrics, attempt)


def _judge_prediction(metrics: GatewayMetrics, attempt: Attempt) -> None:
    """A streamed request served by the replica the policy chose: its TTFT against the one predicted there."""
    if not attempt.stream or attempt.decided_from is None:
        return
    request, snapshot, chosen = attempt.decided_from
    if attempt.backend != chosen:
        return  # served by a fallback
    state = next(b for b in snapshot.backends if b.name == chosen)
    if state.kind != "replica":
        return
    predicted = predicted_ttft(request, state)
    if predicted > 0:
        metrics.ttft_prediction.labels(chosen).observe((attempt.first_token_at - attempt.started) / predicted)


def book_dispatch(
    accountant: Accountant,
    registry: BackendRegistry,
    parsed: ParsedRequest,
    attempt: Attempt,
    candidates: Sequence[str],
    reservation: Reservation | None,
) -> str:
    """Before the request is sent, write ahead what it is booked at should this process be killed before it
    ends: its worst case (``attempt.worst_case_usd``) on the costliest of ``candidates``, outcome
    ``gateway_killed``. Returns the id its :func:`book_ledger` entry must carry to replace that."""
    if attempt.tenant is None or not candidates:
        return ""
    backends = (registry[name] for name in candidates)
    costliest = max(backends, key=lambda b: (b.usd_per_mtok_out, b.usd_per_mtok_in))
    return accountant.dispatched(
        reservation,
        attempt.request_id,
        attempt.tenant.name,
        attempt.route,
        costliest.name,
        costliest.kind,
        parsed.prompt_tokens,
        attempt.worst_case_usd,
        parsed.user,
    )


def book_ledger(
    accountant: Accountant,
    parsed: ParsedRequest,
    attempt: Attempt,
    reservation: Reservation | None,
    entry_id: str = "",
) -> None:
    """Every request that reached a backend is booked, whatever its outcome, under ``entry_id`` (from
    :func:`book_dispatch`; a reservation's id is its own); one that did not gives its reservation back."""
    backend = attempt.served_by
    if backend is None or attempt.tenant is None:
        if reservation is not None:
            accountant.release_soon(reservation)
        elif entry_id:
            accountant.abandon(entry_id)
        return
    usage = attempt.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int):
        prompt_used = prompt
    else:  # a backend that refused the request (a 4xx) processed none of it
        prompt_used = 0 if attempt.outcome == "client_error" else parsed.prompt_tokens
    cost = attempt.cost_usd if attempt.cost_usd is not None else _unknown_cost(attempt, prompt_used)
    entry = LedgerEntry(
        request_id=attempt.request_id,
        time=time.time(),
        tenant=attempt.tenant.name,
        route=attempt.route,
        backend=attempt.backend,
        kind=backend.kind,
        prompt_tokens=prompt_used,
        cached_tokens=cached_tokens(usage),
        completion_tokens=completion if isinstance(completion, int) else 0,
        cost_usd=cost,
        hosted_equivalent_usd=attempt.hosted_equivalent_usd if attempt.hosted_equivalent_usd is not None else cost,
        outcome=attempt.outcome,
        entry_id=entry_id,
        user=parsed.user,
    )
    if reservation is not None:
        accountant.settle_soon(reservation, entry)
    else:
        accountant.record_soon(entry)


def reported_cached_tokens(usage: dict[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``; ``None`` where the backend does not report it (SGLang
    without ``--enable-cache-report``)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


def cached_tokens(usage: dict[str, Any]) -> int:
    """:func:`reported_cached_tokens`, 0 where not reported."""
    return reported_cached_tokens(usage) or 0


def price_cut_off(attempt: Attempt, parsed: ParsedRequest) -> None:
    """Price a request that reached a backend but ended before its usage was reported (a client that left
    mid-stream, a backend that failed), once, before it is counted and booked."""
    usage = attempt.usage or {}
    if attempt.cost_usd is not None or attempt.served_by is None or isinstance(usage.get("completion_tokens"), int):
        return
    prompt = usage.get("prompt_tokens")
    attempt.cost_usd = _unknown_cost(attempt, prompt if isinstance(prompt, int) else parsed.prompt_tokens)


def _unknown_cost(attempt: Attempt, prompt_tokens: int) -> float:
    """A request cut off before its usage was reported: once tokens flowed, assume the worst case; a
    hosted provider that got the request bills its prompt even if nothing came back."""
    if attempt.first_token_at:
        return attempt.worst_case_usd
    backend = attempt.served_by
    if backend is not None and backend.kind == "hosted" and attempt.outcome == "client_disconnected":
        return prompt_tokens * backend.usd_per_mtok_in / 1e6
    return 0.0


def _count_prompt_tokens(metrics: GatewayMetrics, attempt: Attempt) -> None:
    usage = attempt.usage or {}
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int):
        return
    counter = metrics.prompt_tokens
    counter.labels(attempt.backend, "prompt").inc(prompt)
    cached = reported_cached_tokens(usage)
    if cached is not None:
        counter.labels(attempt.backend, "cached").inc(cached)
    if attempt.fingerprint is not None:
        counter.labels(attempt.backend, "predicted_cached").inc(attempt.prefix_tokens.get(attempt.backend, 0))


def _count_spend(metrics: GatewayMetrics, attempt: Attempt, tenant: str, rent: RentBook) -> None:
    """Price the request (hosted at the provider's prices, replicas as the GPU time it took) and count it."""
    usage = attempt.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    backend = attempt.served_by
    if backend is None:
        return
    if not isinstance(prompt, int) or not isinstance(completion, int):
        if attempt.cost_usd:  # no usage came: priced by price_cut_off, with nothing to compare it to
            attempt.hosted_equivalent_usd = attempt.cost_usd
            _count_cost(metrics, attempt, tenant, backend.kind)
        return
    cached = cached_tokens(usage)
    price = rent.price(backend.pool) if backend.kind == "replica" else None
    gpu_seconds = 0.0
    if price is not None:
        gpu_seconds = price.gpu_seconds(prompt - cached, completion)
        if attempt.cost_usd is None:
            attempt.cost_usd = price.usd(gpu_seconds)
    elif attempt.cost_usd is None:
        attempt.cost_usd = 0.0
    # The baseline for savings: the route's hosted model or reference price; a route with neither saves
    # nothing and loses nothing, so its baseline is what it cost. Ledger and metrics then agree everywhere.
    reference = attempt.reference_price
    if reference is not None:
        attempt.hosted_equivalent_usd = reference.cost(prompt, completion, cached, cache_write_tokens(usage))
    else:
        attempt.hosted_equivalent_usd = attempt.cost_usd
    if price is not None and attempt.tenant is not None:
        rent.used(
            price.name,
            attempt.tenant.name,
            attempt.route,
            gpu_seconds,
            prompt + completion,
            attempt.hosted_equivalent_usd if reference is not None else None,
        )
    _count_cost(metrics, attempt, tenant, backend.kind)


def _count_cost(metrics: GatewayMetrics, attempt: Attempt, tenant: str, kind: str) -> None:
    metrics.spend.labels(tenant, attempt.route, attempt.backend, kind, attempt.reason).inc(attempt.cost_usd or 0.0)
    metrics.hosted_equivalent.labels(tenant, attempt.route).inc(attempt.hosted_equivalent_usd or 0.0)


def slo_result(attempt: Attempt) -> str | None:
    """``met``, ``ttft_missed`` or ``tpot_missed`` against the tenant's targets; ``None`` without a first token."""
    tenant = attempt.tenant
    if tenant is None or not attempt.first_token_at:
        return None
    if attempt.first_token_at - attempt.started > tenant.ttft_slo_s:
        return "ttft_missed"
    if attempt.tpot_s is not None and attempt.tpot_s > tenant.tpot_slo_s:
        return "tpot_missed"
    return "met"


def _count_slo(metrics: GatewayMetrics, attempt: Attempt) -> None:
    """Whether the request met its tenant's SLO: the numerator of goodput."""
    result = slo_result(attempt)
    if result is not None and attempt.tenant is not None:
        metrics.slo.labels(attempt.tenant.slo_class, result).inc()


def cache_write_tokens(usage: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cache_creation_tokens``: prompt tokens a hosted model wrote to its cache."""
    details = usage.get("prompt_tokens_details")
    written = details.get("cache_creation_tokens") if isinstance(details, dict) else None
    return written if isinstance(written, int) and written > 0 else 0
