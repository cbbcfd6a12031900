"""Admitting a generation or embeddings request: what the tenant asks for, may they, where it goes, and what it
may cost.

Everything here happens before a backend is sent a byte: parse and check the body, resolve the route, read
the prompt's prefix against each candidate's cache, let the route's policy decide (:mod:`policies`), and hold
the request's worst case against the tenant's limits. Any refusal is an :class:`~gateway.errors.ApiError` in
OpenAI's shape. A route serves one task (its targets' ``task``): generation requests to an embeddings route, and
embeddings requests to a generation route, are refused naming ``model``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import orjson
import xxhash

from spillgate.gateway.accounting import QuotaExceeded, Reservation
from spillgate.gateway.control.routes import Route
from spillgate.gateway.errors import ApiError
from spillgate.gateway.observability.tracing import Tracing
from spillgate.gateway.serving.exchange import Attempt
from spillgate.gateway.serving.rate_headers import rate_limit_headers
from spillgate.gateway.serving.validation import (
    ParsedRequest,
    parse_chat_request,
    parse_completion_request,
    parse_embedding_request,
)
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Tenant
from spillgate.policies.types import Decision, NoCandidate, OverCapacity, RouteRequest, Unservable

MAX_ATTEMPTS = 2
"""A request is tried on at most this many of its ranked candidates: its budget reservation covers them all."""
_PRIORITIES = {"low": 0, "normal": 1, "high": 2}


@dataclass(slots=True)
class Admitted:
    """A request the gateway will forward: its body, where it goes, and what is held for it."""

    parsed: ParsedRequest
    decision: Decision
    reservation: Reservation | None

    @property
    def candidates(self) -> tuple[str, ...]:
        return self.decision.ranked[:MAX_ATTEMPTS]


class Admission:
    """Admits requests to one endpoint (chat, plain completions, or with ``embeddings`` the embeddings)."""

    def __init__(self, state: GatewayState, tracing: Tracing, *, chat: bool, embeddings: bool = False) -> None:
        self._state = state
        self._tracing = tracing
        self._chat = chat
        self._embeddings = embeddings
        self._hosted_serve = chat or embeddings
        """Whether hosted models take this endpoint: chat through litellm's chat client, embeddings its embedding
        one; plain completions they do not."""
        if embeddings:
            self._parse = parse_embedding_request
        else:
            self._parse = parse_chat_request if chat else parse_completion_request

    async def admit(self, tenant: Tenant, body: bytes, attempt: Attempt) -> Admitted:
        parsed, request, route, targets = self._resolve(tenant, body, attempt)
        decision = self.decide(request, route, targets, attempt)
        try:
            decision, reservation = await self._reserve(parsed, request, route, targets, decision, attempt)
        finally:  # the answer, or the refusal, tells a tenant with per-minute limits where it stands
            self._note_rate_usage(attempt)
        return Admitted(parsed, decision, reservation)

    def _resolve(
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
        if route.embeddings is not self._embeddings:
            raise wrong_task(parsed.model, embeddings_route=not self._embeddings)
        attempt.route = route.name
        attempt.reference_price = route.reference_price
        attempt.tenant = tenant
        attempt.stream = parsed.stream
        targets = route.targets_for(tenant.name)
        prefix_key = 0
        if self._embeddings:
            # No prefix to match: a prefix policy routes an input by its hash (consistent_hash) or by load.
            prefix_key = input_key(parsed) if route.policy.uses_prefix else 0
        elif route.policy.uses_prefix:
            parsed = self._match_prefix(parsed, route, targets, tenant, attempt)
            prefix_key = attempt.fingerprint.prefix_key if attempt.fingerprint else 0
        request = RouteRequest(
            tenant=tenant.name,
            route=route.name,
            prompt_tokens=parsed.prompt_tokens,
            max_tokens=parsed.max_tokens,
            stream=parsed.stream,
            sequence=route.next_sequence(),
            prefix_key=prefix_key,
            required_tier=0 if self._embeddings else self._required_tier(parsed, route),
            ttft_slo_s=tenant.ttft_slo_s,
            tpot_slo_s=tenant.tpot_slo_s,
            self_hosted_only=tenant.self_hosted_only,
            spilling=route.spilling,
            chat=self._hosted_serve,
            priority=_PRIORITIES[tenant.priority],
        )
        return parsed, request, route, targets

    def decide(self, request: RouteRequest, route: Route, targets: tuple[str, ...], attempt: Attempt) -> Decision:
        """The route's policy over a snapshot of its candidates; its refusals in OpenAI's shape."""
        registry = self._state.registry
        snapshot = registry.snapshot(targets, attempt.prefix_tokens)
        try:
            with self._tracing.phase("decision") as span:
                decision = route.policy.decide(request, snapshot)
                if span is not None:
                    span.set_attributes({"spillgate.backend": decision.backend, "spillgate.reason": decision.reason})
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
        if not parsed.max_tokens and not self._embeddings:
            # The worst case must be bounded to be reserved: cap the output at the gateway's limit.
            parsed.payload["max_tokens"] = self._state.config.limits.max_tokens
        try:
            return decision, await self._hold(parsed, decision, attempt)
        except QuotaExceeded as refused:
            hosted_cap = refused.limit.startswith("hosted_") and tenant.hosted_over_budget == "self_hosted"
            if not hosted_cap:
                raise _quota_error(refused) from None
            try:
                decision = self.decide(request._replace(hosted_allowed=False), route, targets, attempt)
                return decision, await self._hold(parsed, decision, attempt)
            except ApiError:
                raise _quota_error(refused) from None
            except QuotaExceeded as again:
                raise _quota_error(again) from None

    def _note_rate_usage(self, attempt: Attempt) -> None:
        """Where a tenant with per-minute limits stands after this request, for OpenAI's rate-limit headers."""
        tenant = attempt.tenant
        if tenant is not None and (tenant.limits.requests_per_minute or tenant.limits.tokens_per_minute):
            usage = self._state.accountant.local.rate_usage(tenant.name, tenant.limits, time.time())
            attempt.rate_limits = rate_limit_headers(usage)

    async def _hold(self, parsed: ParsedRequest, decision: Decision, attempt: Attempt) -> Reservation:
        """Reserve a true upper bound: every choice at its output limit, and a prompt of as many tokens as
        the body has bytes (a byte-level tokenizer never makes more), whatever the language or images."""
        assert attempt.tenant is not None
        tokens, attempt.worst_case_usd = self._worst_case(parsed, decision)
        registry = self._state.registry
        return await self._state.accountant.reserve(
            attempt.tenant.name,
            attempt.tenant.limits,
            tokens=tokens,
            worst_case_usd=attempt.worst_case_usd,
            hosted=any(registry[name].hosted for name in decision.ranked[:MAX_ATTEMPTS]),
        )

    def _worst_case(self, parsed: ParsedRequest, decision: Decision) -> tuple[int, float]:
        """Tokens and dollars the request can cost at most, on whichever of its candidates it may end up."""
        registry = self._state.registry
        output = 0 if self._embeddings else (parsed.max_tokens or self._state.config.limits.max_tokens) * parsed.choices
        prompt = max(parsed.prompt_tokens, parsed.body_bytes)
        usd = max(
            (prompt * b.usd_per_mtok_in + output * b.usd_per_mtok_out) / 1e6
            for b in (registry[name] for name in decision.ranked[:MAX_ATTEMPTS])
        )
        return prompt + output, usd

    def _required_tier(self, parsed: ParsedRequest, route: Route) -> int:
        """The tier a prompt needs: the route's top tier when the classifier scores it complex."""
        threshold = route.complexity_threshold
        if threshold is None or not route.complex_tier:
            return 0
        verdict = (route.classifier or self._state.classifier).score(parsed.payload)
        return route.complex_tier if verdict.score >= threshold else 0

    def _match_prefix(
        self, parsed: ParsedRequest, route: Route, targets: tuple[str, ...], tenant: Tenant, attempt: Attempt
    ) -> ParsedRequest:
        """Fingerprint the prompt (salted as the replica's cache will be) and ask the index how much each candidate
        holds. With a tokenizer configured the prompt's token count is known: it replaces the estimate from its
        length. A conversation the model's chat template refuses is routed without prefix affinity (the replica
        gives the client its error)."""
        prefix = self._state.prefix
        payload = parsed.payload
        if self._chat and route.engine is not None:
            messages = route.engine.template_messages(payload)
            if messages is not payload["messages"]:
                payload = {**payload, "messages": messages}
        try:
            salt = tenant.cache_salt(payload.get("cache_salt"))
            fingerprint = prefix.fingerprint(payload, chat=self._chat, salt=salt)
        except ValueError:
            return parsed
        if prefix.tokenizer is not None:
            parsed = replace(parsed, prompt_tokens=max(1, fingerprint.length))
        attempt.fingerprint = fingerprint
        attempt.matched_blocks = prefix.matched_blocks(fingerprint, targets)
        per_block = prefix.tokens_per_block
        attempt.prefix_tokens = {
            name: min(blocks * per_block, parsed.prompt_tokens) for name, blocks in attempt.matched_blocks.items()
        }
        return parsed


def input_key(parsed: ParsedRequest) -> int:
    """A hash of an embeddings request's ``input``: what a prefix-affine policy hashes in place of a prefix."""
    return xxhash.xxh3_64_intdigest(orjson.dumps(parsed.payload.get("input")))


def wrong_task(model: str, *, embeddings_route: bool) -> ApiError:
    """The 400 for a request to a route of the other task, naming ``model`` and the endpoint it takes."""
    if embeddings_route:
        message = (
            f"The model '{model}' is an embeddings model: call POST /v1/embeddings with it, not a generation endpoint."
        )
    else:
        message = (
            f"The model '{model}' is a generation model and does not serve embeddings: call POST /v1/embeddings "
            "with an embeddings model."
        )
    return ApiError(400, message, param="model", code="wrong_model_task")


def _quota_error(refused: QuotaExceeded) -> ApiError:
    header = refused.retry_after_header
    return ApiError(
        429, refused.message, code="quota_exceeded", headers={"retry-after": header} if header is not None else {}
    )
