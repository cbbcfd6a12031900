"""The hot path: ``POST /v1/chat/completions`` and ``/v1/completions`` as plain ASGI handlers.

Authenticate, validate, decide, forward, relay. Streams are relayed event by event as they arrive;
nothing waits to fill a buffer. A client that goes away cancels its upstream request, which closes the
upstream connection and so aborts the generation on the replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import replace
from typing import Any

import orjson

from spillgate.backends.hosted.scrub import scrub
from spillgate.backends.http1 import HttpError, Response
from spillgate.backends.registry import Backend
from spillgate.gateway.accounting import QuotaExceeded, Reservation
from spillgate.gateway.control.routes import Route
from spillgate.gateway.dispatch.coalesce import hold_limit
from spillgate.gateway.dispatch.retry_budget import jittered_backoff
from spillgate.gateway.errors import ApiError, error_body
from spillgate.gateway.serving.bookkeeping import book_dispatch, book_ledger, price_cut_off, record_outcome
from spillgate.gateway.serving.exchange import (
    JSON_HEADERS,
    SSE_HEADERS,
    Attempt,
    DisconnectWatcher,
    Receive,
    Scope,
    Send,
    TryElsewhere,
    header,
    read_body,
    request_id,
    response_headers,
    send_error,
    send_json,
)
from spillgate.gateway.serving.hosted_relay import HostedRelay
from spillgate.gateway.serving.slots import OVERLOADED, InFlightLimit, ReadingBudget
from spillgate.gateway.serving.sse import EventRelay, InvalidEvent, carries_text
from spillgate.gateway.serving.validation import ParsedRequest, parse_chat_request, parse_completion_request
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Tenant
from spillgate.policies.types import Decision, NoCandidate, OverCapacity, RouteRequest, Unservable

log = logging.getLogger("spillgate.proxy")

_UPSTREAM_STATUS = {"connect": 502, "protocol": 502, "timeout": 504}
_FAILURES = {
    "connect": "The backend could not be reached.",
    "protocol": "The backend broke off or sent an invalid response.",
    "timeout": "The backend sent nothing for longer than the gateway's read timeout.",
}
"""What a client is told; which replica failed, and how, goes to the log (replica names are internal)."""
_MAX_ATTEMPTS = 2
_ASSUMED_OUTPUT_TOKENS = 256
"""Output length booked for a request that sets no max_tokens."""
_SHARED_PREFILL_MIN_TOKENS = 256
"""A prefill of fewer shared tokens than this is not worth waiting for: computing them again costs less."""
_LONGEST_HOLD_S = 10.0
"""The longest a request is held at the gateway, for another's prefill or for room at its replica (or its
tenant's TTFT target, if shorter)."""
_PRIORITIES = {"low": 0, "normal": 1, "high": 2}


class CompletionsHandler:
    """One OpenAI generation endpoint; ``upstream_path`` is where the same body goes on the backend."""

    def __init__(self, state: GatewayState, upstream_path: str, slots: InFlightLimit, reading: ReadingBudget) -> None:
        self._state = state
        self._slots = slots
        self._reading = reading
        self._hosted = HostedRelay(state.hosted_http)
        self._upstream_path = upstream_path
        self._chat = upstream_path.endswith("chat/completions")
        self._parse = parse_chat_request if self._chat else parse_completion_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        attempt = Attempt(request_id=request_id(scope), started=time.perf_counter())
        if scope["method"] != "POST":
            await send_error(send, attempt, ApiError(405, "Use POST for this endpoint."))
            return
        state = self._state
        try:
            # The key first, then the whole body (within its deadline), and only then a slot.
            tenant = state.tenants.authenticate(header(scope, b"authorization"))
            body = await read_body(
                scope, receive, state.config.limits.max_body_bytes, state.config.timeouts.client_body_s, self._reading
            )
        except ApiError as error:
            # The body is not read (or not all of it): the connection cannot carry another request.
            error.headers["connection"] = "close"
            await send_error(send, attempt, error)
            return
        if not self._slots.try_take():
            state.metrics.overloaded.inc()
            await send_json(send, 503, [*JSON_HEADERS, (b"retry-after", b"1")], OVERLOADED)
            return
        try:
            try:
                parsed, request, route, targets = self._admit(tenant, body, attempt)
                decision = self._decide(request, route, targets, attempt)
                decision, reservation = await self._reserve(parsed, request, route, targets, decision, attempt)
            except ApiError as error:
                await send_error(send, attempt, error)
                return
            await self._forward(parsed, decision, attempt, reservation, receive, send)
        finally:
            self._slots.give_back()

    def _admit(
        self, tenant: Tenant, body: bytes, attempt: Attempt
    ) -> tuple[ParsedRequest, RouteRequest, Route, tuple[str, ...]]:
        """What the tenant asks for, and may they: everything checked before a backend is chosen."""
        state = self._state
        parsed = self._parse(body, state.config.limits)
        route = state.routes.get(parsed.model)
        if route is None:
            raise ApiError(404, f"The model '{parsed.model}' does not exist.", param="model", code="model_not_found")
        if not tenant.may_use(route.name):
            raise ApiError(
                403, f"This key may not use the model '{parsed.model}'.", param="model", code="model_not_allowed"
            )
        attempt.route = route.name
        attempt.reference_price = route.reference_price
        attempt.tenant = tenant
        attempt.stream = parsed.stream
        targets = route.targets_for(tenant.name)
        if route.policy.uses_prefix:
            parsed = self._match_prefix(parsed, targets, route.name, tenant.name, attempt)
        request = RouteRequest(
            tenant=tenant.name,
            route=route.name,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            sequence=route.next_sequence(),
            prefix_key=attempt.fingerprint.prefix_key if attempt.fingerprint else 0,
            required_tier=self._required_tier(parsed, route),
            ttft_slo_s=tenant.ttft_slo_s,
            tpot_slo_s=tenant.tpot_slo_s,
            self_hosted_only=tenant.self_hosted_only,
            spilling=route.spilling,
            chat=self._chat,
            priority=_PRIORITIES[tenant.priority],
        )
        return parsed, request, route, targets

    def _decide(self, request: RouteRequest, route: Route, targets: tuple[str, ...], attempt: Attempt) -> Decision:
        registry = self._state.registry
        snapshot = registry.snapshot(targets, attempt.prefix_tokens)
        try:
            decision = route.policy.decide(request, snapshot)
        except Unservable as exc:
            raise ApiError(
                400, f"'{route.name}' cannot serve this request: {exc}.", code="unservable_request"
            ) from None
        except NoCandidate as exc:
            raise ApiError(
                503,
                f"No backend can serve '{route.name}' right now: {exc}.",
                code="no_healthy_backend",
                headers={"retry-after": "1"},
            ) from None
        except OverCapacity as exc:
            self._state.capacity.refused(attempt)
            raise ApiError(
                429,
                f"'{route.name}' is at capacity: {exc}. Retry later.",
                code="over_capacity",
                headers={"retry-after": str(max(1, math.ceil(exc.retry_after_s)))},
            ) from None
        route.remember(decision, registry[decision.backend].kind)
        attempt.decided_from = (request, snapshot, decision.backend)
        return decision

    async def _reserve(
        self,
        parsed: ParsedRequest,
        request: RouteRequest,
        route: Route,
        targets: tuple[str, ...],
        decision: Decision,
        attempt: Attempt,
    ) -> tuple[Decision, Reservation | None]:
        """Hold the request's worst case against the tenant's limits before anything is sent. Past a hosted
        budget, the tenant's rule decides: decide again without hosted models (reason ``budget``), or 429."""
        tenant = attempt.tenant
        if tenant is None or tenant.limits.unlimited:
            # Nothing to reserve, but a stream cut off before its usage came is booked at this worst case.
            attempt.worst_case_usd = self._worst_case(parsed, decision)[1]
            return decision, None
        if not parsed.max_tokens:
            # The worst case must be bounded to be reserved: cap the output at the gateway's limit.
            parsed.payload["max_tokens"] = self._state.config.limits.max_tokens
        try:
            return decision, await self._hold(parsed, decision, attempt)
        except QuotaExceeded as refused:
            hosted_cap = refused.limit.startswith("hosted_") and tenant.hosted_over_budget == "self_hosted"
            if not hosted_cap:
                raise _quota_error(refused) from None
            try:
                decision = self._decide(request._replace(hosted_allowed=False), route, targets, attempt)
                return decision, await self._hold(parsed, decision, attempt)
            except ApiError:
                raise _quota_error(refused) from None
            except QuotaExceeded as again:
                raise _quota_error(again) from None

    async def _hold(self, parsed: ParsedRequest, decision: Decision, attempt: Attempt) -> Reservation:
        """Reserve a true upper bound: every choice at its output limit, and a prompt of as many tokens as
        the body has bytes (a byte-level tokenizer never makes more), whatever the language or images."""
        assert attempt.tenant is not None
        tokens, attempt.worst_case_usd = self._worst_case(parsed, decision)
        return await self._state.accountant.reserve(
            attempt.tenant.name,
            attempt.tenant.limits,
            tokens=tokens,
            worst_case_usd=attempt.worst_case_usd,
            hosted=any(self._state.registry[name].kind == "hosted" for name in decision.ranked[:_MAX_ATTEMPTS]),
        )

    def _worst_case(self, parsed: ParsedRequest, decision: Decision) -> tuple[int, float]:
        """Tokens and dollars the request can cost at most, on whichever of its candidates it may end up."""
        registry = self._state.registry
        output = (parsed.max_tokens or self._state.config.limits.max_tokens) * parsed.choices
        prompt = max(parsed.prompt_tokens, parsed.body_bytes)
        usd = max(
            (prompt * b.usd_per_mtok_in + output * b.usd_per_mtok_out) / 1e6
            for b in (registry[name] for name in decision.ranked[:_MAX_ATTEMPTS])
        )
        return prompt + output, usd

    def _required_tier(self, parsed: ParsedRequest, route: Route) -> int:
        """The tier a prompt needs: the route's top tier when the classifier scores it complex."""
        threshold = route.spill.complexity_threshold
        if threshold is None or not route.complex_tier:
            return 0
        verdict = self._state.classifier.score(parsed.payload)
        return route.complex_tier if verdict.score >= threshold else 0

    def _match_prefix(
        self, parsed: ParsedRequest, targets: tuple[str, ...], route: str, tenant: str, attempt: Attempt
    ) -> ParsedRequest:
        """Fingerprint the prompt (salted by tenant) and ask the index how much each candidate holds. With a
        tokenizer configured the prompt's token count is known: it replaces the estimate from its length."""
        prefix = self._state.prefix
        fingerprint = prefix.fingerprint(parsed.payload, chat=self._chat, model=route, salt=tenant)
        if prefix.tokenizer is not None:
            parsed = replace(parsed, prompt_tokens=max(1, fingerprint.length))
        attempt.fingerprint = fingerprint
        attempt.matched_blocks = prefix.matched_blocks(fingerprint, targets)
        per_block = prefix.tokens_per_block
        attempt.prefix_tokens = {
            name: min(blocks * per_block, parsed.prompt_tokens) for name, blocks in attempt.matched_blocks.items()
        }
        return parsed

    async def _forward(
        self,
        parsed: ParsedRequest,
        decision: Decision,
        attempt: Attempt,
        reservation: Reservation | None,
        receive: Receive,
        send: Send,
    ) -> None:
        entry_id = book_dispatch(self._state, parsed, attempt, decision.ranked[:_MAX_ATTEMPTS], reservation)
        watcher = DisconnectWatcher(receive)
        try:
            attempt.outcome = await self._try_backends(parsed, decision, attempt, send)
        except asyncio.CancelledError:
            if not watcher.disconnected:
                raise
            attempt.outcome = "client_disconnected"
        finally:
            watcher.stop()
            price_cut_off(attempt, parsed)
            record_outcome(
                self._state.metrics, attempt, self._state.rent, tenant_labels=self._state.config.metrics.tenant_labels
            )
            book_ledger(self._state.accountant, parsed, attempt, reservation, entry_id)
            self._state.capacity.finished(attempt, time.perf_counter())  # after record_outcome has priced it

    async def _try_backends(self, parsed: ParsedRequest, decision: Decision, attempt: Attempt, send: Send) -> str:
        """Send to the first choice; if it fails before the client saw a byte, to the next one (after a short
        jittered wait, and only while the retry budget allows: a sick fleet is not sent everything twice)."""
        registry = self._state.registry
        self._state.retries.request(time.monotonic())
        error: ApiError | None = None
        for index, name in enumerate(decision.ranked[:_MAX_ATTEMPTS]):
            backend = registry[name]
            first = index == 0
            if not first and not await self._may_fall_back(backend, index):
                break
            if first and backend.kind == "replica" and attempt.stream:
                # Before the backend is named: a client that leaves while held was never served.
                await self._await_shared_prefill(backend, attempt)
            attempt.first_token_at = 0.0
            attempt.usage = None
            self._book(backend, parsed, attempt, may_hold=first)
            trial = False
            try:
                if attempt.lead is not None and attempt.lead.released is not None:
                    await self._await_release(backend, attempt)  # booked, but not named until sent
                attempt.backend = name
                attempt.served_by = backend
                attempt.reason = decision.reason if first else "fallback"
                if backend.kind == "hosted":
                    outcome = await self._hosted.serve(
                        self._state.hosted_models[name], backend, parsed, attempt, send, self._first_token
                    )
                    if outcome == "ok" and attempt.stream:
                        self._observe_tpot(backend, attempt)  # hosted TTFT/TPOT predictions learn from this
                    return outcome
                trial = registry.dispatched(backend)
                return await self._serve_replica(backend, parsed, attempt, send)
            except TryElsewhere as failure:
                error = failure.error
                if not failure.retryable:
                    break
            finally:
                if trial:
                    registry.trial_abandoned(backend)  # no verdict (the client left): the next request tries
                self._settle(backend, attempt, prefilled=bool(attempt.first_token_at))
        assert error is not None
        await send_error(send, attempt, error)
        return "error"

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
        return True

    async def _serve_replica(self, backend: Backend, parsed: ParsedRequest, attempt: Attempt, send: Send) -> str:
        """Send the request to a replica and relay its answer. Everything that goes wrong before the client has
        seen a byte may be tried on another candidate; every answer tells the replica's outlier detection."""
        payload = parsed.payload
        prepare_replica_payload(payload, backend.served_model, attempt.tenant, backend.engine.owned_fields)
        if parsed.stream:
            # Always learn the usage; the relay strips that chunk if the client did not ask for it.
            payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
        try:
            response = await self._state.upstream.post(
                backend.base_url, self._upstream_path, orjson.dumps(payload), backend.request_headers
            )
        except HttpError as exc:
            # Nothing reached the client: a timeout may still be generating, but closing the connection aborts it.
            raise TryElsewhere(self._replica_failed(backend, exc), retryable=True) from None
        try:
            if response.status >= 500:
                failure = f"answered {response.status}"
                self._replica_failed(backend, failure)
                raise TryElsewhere(
                    ApiError(502, f"The backend answered {response.status}.", code="backend_error"), retryable=True
                )
            if response.status in (401, 403):
                # The gateway's own key was refused, not the client's: a misconfigured pool, worth another replica.
                log.warning(
                    "backend %s refused the gateway's key (%s): check the pool's api_key", backend.name, response.status
                )
                self._replica_failed(backend, f"refused the gateway's key ({response.status})")
                raise TryElsewhere(
                    ApiError(502, "The backend refused the gateway's credentials.", code="backend_auth"),
                    retryable=True,
                )
            if response.status >= 400:
                self._state.registry.request_succeeded(backend)  # an answer about the request: the replica works
                return await self._relay_client_error(response, attempt, send)
            if parsed.stream:
                return await self._relay_stream(response, backend, parsed, attempt, send)
            return await self._relay_whole(response, backend, attempt, send)
        finally:
            response.close()

    def _replica_failed(self, backend: Backend, failure: HttpError | InvalidEvent | str) -> ApiError:
        """Tell the replica's outlier detection a request failed there (counting an ejection if it was one), log
        which and why, and return what the client is told: neither the replica's name nor its words."""
        if isinstance(failure, HttpError):
            error = _upstream_error(failure, backend.name)
            reason = f"{failure.kind}: {failure}"
        else:
            error = ApiError(502, "The backend sent an invalid response.", code="backend_invalid_response")
            reason = f"invalid response: {failure}"
            log.warning("backend %s sent an invalid response: %s", backend.name, failure)
        unreachable = isinstance(failure, HttpError) and failure.kind == "connect"
        if self._state.registry.request_failed(backend, reason, unreachable=unreachable):
            self._state.metrics.ejections.labels(backend.name).inc()
        return error

    async def _await_shared_prefill(self, backend: Backend, attempt: Attempt) -> None:
        """If a request sent earlier will compute this one's prefix on ``backend`` but has not started, wait until
        it has, so that this one lands in a later batch and finds the prefix cached
        (:mod:`gateway.dispatch.coalesce`)."""
        fingerprint = attempt.fingerprint
        if fingerprint is None:
            return
        state = self._state
        lead, blocks = state.prefilling.computing(
            backend.name, fingerprint.hashes, attempt.matched_blocks.get(backend.name, 0)
        )
        if lead is None or lead.joinable.done() or blocks * state.prefix.tokens_per_block < _SHARED_PREFILL_MIN_TOKENS:
            return
        state.metrics.prefill_waits.labels(backend.name).inc()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(lead.joinable), _longest_wait(attempt))

    async def _await_release(self, backend: Backend, attempt: Attempt) -> None:
        """Wait while the replica has enough prompts waiting unscheduled (an eighth of a prefill batch by default,
        :mod:`gateway.dispatch.coalesce`): sent now, the prompt would make their batch longer; held, it leads
        the next."""
        lead = attempt.lead
        assert lead is not None and lead.released is not None
        prefilling = self._state.prefilling
        self._state.metrics.prompt_holds.labels(backend.name).inc()
        try:
            await asyncio.wait_for(asyncio.shield(lead.released), _longest_wait(attempt))
        except TimeoutError:
            prefilling.send_now(lead)
            self._track_batch(backend)
        # Measured from here, behind what is booked there less this prompt and the prompts held behind it.
        held_tokens, held = prefilling.held(backend.name)
        ahead = backend.pending_prefill_tokens - held_tokens - attempt.pending_prefill
        self._mark_sent(backend, attempt, ahead + backend.peer_pending_prefill_tokens, backend.in_flight - 1 - held)

    def _book(self, backend: Backend, parsed: ParsedRequest, attempt: Attempt, *, may_hold: bool = False) -> None:
        """Count the request against ``backend`` before it is sent, so concurrent decisions see it (also while
        the gateway holds it back, since it goes ahead of the requests decided after it)."""
        self._mark_sent(
            backend,
            attempt,
            backend.pending_prefill_tokens + backend.peer_pending_prefill_tokens,
            backend.in_flight + backend.peer_in_flight,
        )
        backend.in_flight += 1
        backend.sent_total += 1
        attempt.booked_tokens = parsed.max_tokens or _ASSUMED_OUTPUT_TOKENS
        backend.outstanding_tokens += attempt.booked_tokens
        attempt.pending_prefill = max(0, parsed.prompt_tokens - attempt.prefix_tokens.get(backend.name, 0))
        backend.pending_prefill_tokens += attempt.pending_prefill
        fingerprint = attempt.fingerprint
        if fingerprint is not None:
            self._state.prefix.dispatched(backend.name, fingerprint)
        if backend.kind == "replica" and attempt.stream:
            # Streams only: a whole response shows its first token at the end, long after its prefill.
            attempt.lead = self._state.prefilling.sent(
                backend.name,
                fingerprint.hashes if fingerprint is not None else (),
                attempt.matched_blocks.get(backend.name, 0),
                attempt.pending_prefill,
                backend.prefill_batch_tokens,
                hold_limit(backend.max_waiting_prefill, backend.prefill_batch_tokens) if may_hold else 0,
                backend.info is not None and backend.info.overlap_schedule,
            )
            self._state.prefix.announce(backend.name, attempt.lead)
            self._track_batch(backend)

    @staticmethod
    def _mark_sent(backend: Backend, attempt: Attempt, prefill_ahead: int, in_flight_ahead: int) -> None:
        """The request leaves for ``backend`` now, behind ``prefill_ahead`` uncached tokens and
        ``in_flight_ahead`` requests of ours there."""
        slots_full = backend.max_running and in_flight_ahead >= backend.max_running
        attempt.prefill_ahead = None if slots_full else prefill_ahead
        attempt.sent_to_busy = in_flight_ahead > 0
        attempt.sent_at = time.perf_counter()

    def _first_token(self, backend: Backend, attempt: Attempt) -> None:
        now = attempt.first_token_at = time.perf_counter()
        if attempt.stream and backend.kind == "replica":
            _learn_prefill_rate(backend, attempt, now)
            backend.prefilled_tokens += attempt.pending_prefill
        backend.pending_prefill_tokens -= attempt.pending_prefill
        attempt.pending_prefill = 0
        if attempt.lead is not None:
            self._state.prefilling.ended(attempt.lead)
            attempt.lead = None
            self._track_batch(backend)

    def _track_batch(self, backend: Backend) -> None:
        """The replica's batch in progress may have changed: tell the registry, whose snapshots count it done as
        it computes."""
        backend.running_prefill_tokens, backend.running_prefill_since = self._state.prefilling.running(backend.name)

    def _settle(self, backend: Backend, attempt: Attempt, *, prefilled: bool) -> None:
        """Undo :meth:`_book` and feed what the backend reported back into the prefix index."""
        backend.in_flight -= 1
        backend.outstanding_tokens -= attempt.booked_tokens
        backend.pending_prefill_tokens -= attempt.pending_prefill
        attempt.pending_prefill = 0
        if attempt.lead is not None:
            self._state.prefilling.ended(attempt.lead)
            attempt.lead = None
            self._track_batch(backend)
        if attempt.usage is not None:
            backend.observe_usage(attempt.usage)
        fingerprint = attempt.fingerprint
        if fingerprint is None:
            return
        predicted = attempt.matched_blocks.get(backend.name, 0)
        if not prefilled:
            self._state.prefix.failed(backend.name, fingerprint, predicted)
        elif attempt.usage is not None:
            self._state.prefix.observed(backend.name, fingerprint, predicted, attempt.usage)

    async def _relay_whole(self, response: Response, backend: Backend, attempt: Attempt, send: Send) -> str:
        """Read the whole answer, and relay it only if it is a completion: anything else is the replica's failure,
        which another candidate may make good, since the client has seen nothing yet."""
        try:
            body = await response.read()
        except HttpError as exc:
            raise TryElsewhere(self._replica_failed(backend, exc), retryable=True) from None
        completion = _completion_of(body)
        if completion is None:
            raise TryElsewhere(
                self._replica_failed(backend, f"a {response.status} body that is not a completion: {body[:40]!r}"),
                retryable=True,
            )
        self._first_token(backend, attempt)
        self._state.registry.request_succeeded(backend)
        usage = completion.get("usage")
        attempt.usage = usage if isinstance(usage, dict) else None
        await send_json(send, response.status, response_headers(attempt, JSON_HEADERS), body)
        return "ok"

    async def _relay_stream(
        self, response: Response, backend: Backend, parsed: ParsedRequest, attempt: Attempt, send: Send
    ) -> str:
        """Relay event by event. The status and headers leave with the first event, so a replica that fails or
        sends something else before it can still be replaced; after that, a failure is reported in-band."""
        relay = EventRelay(strip_usage=not parsed.include_usage)
        started = False
        try:
            async for data in response.iter_bytes():
                events = relay.feed(data)
                if events:
                    if not started:
                        started = await self._start_stream(attempt, send)
                    if not attempt.first_token_at:
                        self._first_token(backend, attempt)
                    if backend.kind == "replica":
                        self._saw_text(backend, attempt, events)
                    await send({"type": "http.response.body", "body": events, "more_body": True})
            tail = relay.flush()
            if not started and not relay.events and not tail.strip():
                raise InvalidEvent("a stream without a single event")
        except (HttpError, InvalidEvent) as exc:
            error = self._replica_failed(backend, exc)
            if not started:
                raise TryElsewhere(error, retryable=True) from None
            # Headers are gone already: tell the client in-band, the way OpenAI reports mid-stream errors.
            await send({"type": "http.response.body", "body": b"data: " + error.body() + b"\n\n", "more_body": False})
            return "error"
        if not started:
            await self._start_stream(attempt, send)
        self._state.registry.request_succeeded(backend)
        await send({"type": "http.response.body", "body": tail})
        attempt.usage = relay.usage
        self._observe_tpot(backend, attempt)
        return "ok"

    @staticmethod
    async def _start_stream(attempt: Attempt, send: Send) -> bool:
        await send({"type": "http.response.start", "status": 200, "headers": response_headers(attempt, SSE_HEADERS)})
        return True

    def _saw_text(self, backend: Backend, attempt: Attempt, events: bytes) -> None:
        """Text from a later pass than the stream's first means the replica has begun another pass: with the
        overlap scheduler, prefixes whose batch formed before it may now be joined
        (:mod:`gateway.dispatch.coalesce`)."""
        if not attempt.streamed_text:
            attempt.streamed_text = carries_text(events)
        elif self._state.prefilling.awaits_pass(backend.name) and carries_text(events):
            self._state.prefilling.progressed(backend.name)

    async def _relay_client_error(self, response: Response, attempt: Attempt, send: Send) -> str:
        """A 4xx from the backend is about the request: pass it on, in OpenAI's shape."""
        try:
            body = await response.read()
        except HttpError:
            body = b""
        body = _as_openai_error(body, response.status, attempt.served_by)
        await send_json(send, response.status, response_headers(attempt, JSON_HEADERS), body)
        return "client_error"

    def _observe_tpot(self, backend: Backend, attempt: Attempt) -> None:
        """Record TPOT, and feed TTFT and TPOT to the backend's recent means (what hosted predictions use)."""
        tokens = (attempt.usage or {}).get("completion_tokens")
        tpot = None
        if isinstance(tokens, int) and tokens > 1 and attempt.first_token_at:
            tpot = (time.perf_counter() - attempt.first_token_at) / (tokens - 1)
            attempt.tpot_s = tpot
            self._state.metrics.tpot.labels(attempt.backend).observe(tpot)
        backend.observe_latency(attempt.first_token_at - attempt.sent_at if attempt.first_token_at else None, tpot)


def _longest_wait(attempt: Attempt) -> float:
    if attempt.tenant is None:
        return _LONGEST_HOLD_S
    return min(_LONGEST_HOLD_S, attempt.tenant.ttft_slo_s)


def _quota_error(refused: QuotaExceeded) -> ApiError:
    header = refused.retry_after_header
    return ApiError(
        429, refused.message, code="quota_exceeded", headers={"retry-after": header} if header is not None else {}
    )


def prepare_replica_payload(
    payload: dict[str, Any], served_model: str, tenant: Tenant | None, owned_fields: tuple[str, ...]
) -> None:
    """Rewrite a client's body for a replica: its model name, the tenant's cache salt, none of the fields its
    engine lets only the gateway set."""
    payload["model"] = served_model
    for owned in owned_fields:
        payload.pop(owned, None)
    salt = tenant.cache_salt(payload.pop("cache_salt", None)) if tenant else None
    if salt is not None:
        payload["cache_salt"] = salt


def _learn_prefill_rate(backend: Backend, attempt: Attempt, now: float) -> None:
    """Teach the replica's prefill estimate (:mod:`backends.prefill_rate`) what this first token took.

    In the gateway's own units, at the first token rather than from the usage at the end: predictions count
    pending and uncached tokens as the gateway estimates them, and a rate learned a whole reply sooner follows
    a burst while it lasts."""
    previous = backend.last_first_token_at
    backend.last_first_token_at = now
    # Other gateway processes' requests prefilled here since the previous first token (gateway.peer_load).
    peers_prefilled = backend.peer_prefilled_tokens - backend.peer_prefilled_at_first_token
    backend.peer_prefilled_at_first_token = backend.peer_prefilled_tokens
    if attempt.prefill_ahead is None:
        return  # sent while every running slot was taken: its wait included other requests' decoding
    # Waiting since before the previous first token: the replica worked on this one (and whatever the other
    # processes had prefilled meanwhile) from then to now.
    drain_s = now - previous if attempt.started < previous else None
    backend.prefill.observe(
        attempt.prefill_ahead,
        attempt.pending_prefill,
        now - attempt.sent_at,
        drain_s,
        drained_tokens=attempt.pending_prefill + peers_prefilled,
        busy=attempt.sent_to_busy,
    )


def _completion_of(body: bytes) -> dict[str, Any] | None:
    """The completion a replica answered, or None when the body is not one (not JSON, or no ``choices``)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list):
        return None
    return parsed


def _as_openai_error(body: bytes, status: int, backend: Backend | None) -> bytes:
    """A replica's 4xx body in OpenAI's shape with the engine's message kept (SGLang writes it flat, vLLM as
    OpenAI does), else a generic refusal. The message is scrubbed of the replica's key and anything shaped like a
    credential (a server may echo what it was sent), and names no replica: the log does."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    found = backend.engine.error_message(parsed) if backend is not None else None
    name = backend.name if backend is not None else "-"
    if found is not None:
        message, param = found
        message = scrub(message, (backend.api_key,) if backend is not None and backend.api_key else ())
        log.info("backend %s refused a request (%s): %s", name, status, message)
        return error_body(status, message, param=param)
    log.info("backend %s refused a request (%s) without a readable reason", name, status)
    return error_body(status, "The backend refused the request.", code="backend_refused")


def _upstream_error(exc: HttpError, backend: str) -> ApiError:
    """The client learns how the backend failed, not which one, its address or the socket error: the log does."""
    log.info("backend %s failed: %s", backend, exc)
    return ApiError(_UPSTREAM_STATUS[exc.kind], _FAILURES[exc.kind], code=f"backend_{exc.kind}")
