"""Forwarding an admitted request: its ranked candidates in turn, one dispatch ticket each, until one answers.

The first choice is sent at once (after waiting, for a stream to a replica, for a request that computes the same
prefix there, or for room in the replica's prefill order). If it fails before the client saw a byte, the next
candidate takes the request after a short jittered wait, while the retry budget allows: a sick fleet is not sent
everything twice. Whatever happens, the request's books are closed once: metrics, price and ledger entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from opentelemetry.trace import Span

from spillgate.backends.backend import Backend
from spillgate.gateway.accounting.bookkeeping import book_dispatch, book_ledger, price_cut_off, record_outcome
from spillgate.gateway.dispatch.retry_budget import jittered_backoff
from spillgate.gateway.errors import ApiError
from spillgate.gateway.observability.tracing import Tracing
from spillgate.gateway.serving.admission import Admitted
from spillgate.gateway.serving.exchange import Attempt, DisconnectWatcher, Receive, Send, TryElsewhere, send_error
from spillgate.gateway.serving.upstream import Upstream, UpstreamCall
from spillgate.gateway.state import GatewayState

log = logging.getLogger("spillgate.serving")

_LONGEST_HOLD_S = 10.0
"""The longest a request is held at the gateway, for another's prefill or for room at its replica (or its
tenant's TTFT target, if shorter)."""
_DEPARTED = ApiError(
    503,
    "The backend chosen left rotation before the request was sent.",
    code="backend_departed",
    headers={"retry-after": "1"},
)


class Forwarder:
    """Forwards one endpoint's admitted requests to ``path`` on their backends."""

    def __init__(self, state: GatewayState, path: str, upstreams: Mapping[str, Upstream], tracing: Tracing) -> None:
        self._state = state
        self._path = path
        self._upstreams = upstreams
        """The upstream that serves each kind of backend."""
        self._tracing = tracing
        self._unknown_output: int | None = 0 if path.endswith("embeddings") else None
        """What a request without an output limit will produce: nothing for embeddings, unknown otherwise."""

    async def forward(self, admitted: Admitted, attempt: Attempt, receive: Receive, send: Send) -> None:
        """Serve the request and close its books, whether it is answered, fails, or the client goes away."""
        state = self._state
        entry_id = book_dispatch(
            state.accountant, state.registry, admitted.parsed, attempt, admitted.candidates, admitted.reservation
        )
        watcher = DisconnectWatcher(receive)
        try:
            attempt.outcome = await self._try_candidates(admitted, attempt, send)
        except asyncio.CancelledError:
            if not watcher.disconnected:
                raise
            attempt.outcome = "client_disconnected"
        finally:
            watcher.stop()
            price_cut_off(attempt, admitted.parsed)
            record_outcome(state.metrics, attempt, state.rent, tenant_labels=state.config.metrics.tenant_labels)
            book_ledger(state.accountant, admitted.parsed, attempt, admitted.reservation, entry_id)
            state.capacity.finished(attempt, time.perf_counter())  # after record_outcome has priced it

    async def _try_candidates(self, admitted: Admitted, attempt: Attempt, send: Send) -> str:
        state = self._state
        state.retries.request(time.monotonic())
        error: ApiError | None = None
        for index, name in enumerate(admitted.candidates):
            backend = state.registry[name]
            if index and not await self._may_fall_back(backend, index):
                break
            try:
                return await self._attempt(admitted, attempt, backend, send, first=index == 0)
            except TryElsewhere as failure:
                error = failure.error
                if not failure.retryable:
                    break
        assert error is not None
        await send_error(send, attempt, error)
        # Below 500 the error is a backend's verdict on the request (a provider's 400 or 429), only passed on.
        attempt.refused = error.status >= 500
        return "error"

    async def _attempt(self, admitted: Admitted, attempt: Attempt, backend: Backend, send: Send, *, first: bool) -> str:
        """One candidate: booked on a ticket for as long as it is tried, settled however it ends."""
        state, parsed = self._state, admitted.parsed
        upstream = self._upstreams[backend.kind]
        prefill_order = upstream.follows_prefill and parsed.stream
        if first and prefill_order:
            # Before the backend is named: a client that leaves while held was never served.
            lead = state.dispatcher.shared_prefill(backend, attempt.fingerprint, attempt.matched_blocks)
            if lead is not None:
                state.metrics.prefill_waits.labels(backend.name).inc()
                with self._tracing.phase("hold", cause="shared_prefill"), contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(lead), _longest_wait(attempt))
                _still_in_rotation(backend)
        attempt.first_token_at = 0.0
        attempt.usage = None
        ticket = state.dispatcher.book(
            backend,
            prompt_tokens=parsed.prompt_tokens,
            output_tokens=parsed.max_tokens or self._unknown_output,
            fingerprint=attempt.fingerprint,
            matched_blocks=attempt.matched_blocks,
            prefix_tokens=attempt.prefix_tokens,
            prefill_order=prefill_order,
            may_hold=first,
            started=attempt.started,
        )
        with ticket:
            if ticket.held:
                state.metrics.prompt_holds.labels(backend.name).inc()
                with self._tracing.phase("hold", cause="prefill_queue"):
                    await ticket.wait_turn(_longest_wait(attempt))  # booked, but not named until sent
                _still_in_rotation(backend)
            attempt.backend = backend.name
            if attempt.fingerprint is not None and not backend.hosted:
                attempt.prefix_source = state.prefix.source(backend.name)
            attempt.served_by = backend
            attempt.reason = admitted.decision.reason if first else "fallback"
            attempt.sent_at = ticket.sent_at
            with self._tracing.phase("upstream") as span:
                outcome = await self._serve(upstream, UpstreamCall(parsed, attempt, ticket, send, self._path), span)
            if outcome == "ok":
                tpot = ticket.done(attempt.usage, streamed=attempt.stream)
                if tpot is not None:
                    attempt.tpot_s = tpot
                    state.metrics.tpot.labels(backend.name).observe(tpot)
            return outcome

    async def _serve(self, upstream: Upstream, call: UpstreamCall, span: Span | None) -> str:
        """Send the attempt; with tracing on, its backend is told the upstream span as its parent, and the span
        gets a ``first_token`` child from sending to the first token."""
        attempt = call.attempt
        if span is None:
            return await upstream.serve(call)
        span.set_attribute("spillgate.backend", attempt.backend)
        attempt.upstream_trace = self._tracing.outgoing()
        try:
            outcome = await upstream.serve(call)
            span.set_attribute("spillgate.outcome", outcome)
            return outcome
        finally:
            if attempt.first_token_at:
                self._tracing.interval("first_token", attempt.sent_at, attempt.first_token_at)

    async def _may_fall_back(self, backend: Backend, attempt_number: int) -> bool:
        """Whether the next candidate may take a request the previous one failed, after a jittered wait: not if it
        left rotation since the decision, nor past the retry budget."""
        state = self._state
        now = time.monotonic()
        if not backend.state(now).healthy:
            return False
        if not state.retries.try_retry(now):
            state.metrics.fallbacks_refused.inc()
            log.warning("retry budget spent: not falling back to %s", backend.name)
            return False
        backoff = jittered_backoff(state.config.outlier.retry_backoff_s, attempt_number)
        if backoff > 0:
            await asyncio.sleep(backoff)
            if backend.departed:
                log.info("backend %s left rotation during the retry backoff: not falling back to it", backend.name)
                return False
        return True


def _still_in_rotation(backend: Backend) -> None:
    """After a wait, before sending: a replica that left the catalog meanwhile gets nothing new (its address may
    already be another pod's, which must not receive the pool's key); the next candidate may take the request."""
    if backend.departed:
        log.info("backend %s left rotation while a request waited for it: trying elsewhere", backend.name)
        raise TryElsewhere(_DEPARTED, retryable=True)


def _longest_wait(attempt: Attempt) -> float:
    if attempt.tenant is None:
        return _LONGEST_HOLD_S
    return min(_LONGEST_HOLD_S, attempt.tenant.ttft_slo_s)
