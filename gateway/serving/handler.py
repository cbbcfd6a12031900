"""The hot path: ``POST /v1/chat/completions`` and ``/v1/completions`` (also without ``/v1``) as plain ASGI
handlers.

A request's life, each step in its own module: the key, the body and a slot here; then admission (parse, route,
decide, reserve: :mod:`gateway.serving.admission`), forwarding (ranked candidates, one dispatch ticket each:
:mod:`gateway.serving.forwarding`) and relaying (whole or streamed: :mod:`gateway.serving.relay`), through the
upstream that serves each kind of backend (:mod:`gateway.serving.replica`, :mod:`gateway.serving.hosted`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from spillgate.gateway.errors import ApiError, error_body, wrong_method
from spillgate.gateway.observability.trace_context import client_trace
from spillgate.gateway.observability.tracing import RequestTrace, Tracing
from spillgate.gateway.serving.admission import Admission
from spillgate.gateway.serving.drain import Drain, end_cut, refuse
from spillgate.gateway.serving.exchange import (
    JSON_HEADERS,
    Attempt,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    request_id,
    send_error,
    send_json,
)
from spillgate.gateway.serving.forwarding import Forwarder
from spillgate.gateway.serving.hosted import HostedUpstream
from spillgate.gateway.serving.observer import CLIENT_CLOSED, RequestObserver
from spillgate.gateway.serving.replica import ReplicaUpstream
from spillgate.gateway.serving.slots import OVERLOADED, InFlightLimit, ReadingBudget
from spillgate.gateway.serving.upstream import Upstream
from spillgate.gateway.state import GatewayState

log = logging.getLogger("spillgate.gateway")

_INTERNAL_ERROR = error_body(500, "The gateway hit an internal error; it has been logged.", code="internal_error")


def upstreams(state: GatewayState) -> dict[str, Upstream]:
    """The upstream that serves each kind of backend: the one place a kind names an implementation."""
    return {
        "replica": ReplicaUpstream(state.upstream, state.registry, state.metrics),
        "hosted": HostedUpstream(lambda: state.hosted_models, state.hosted_http),
    }


class CompletionsHandler:
    """One OpenAI generation endpoint; ``upstream_path`` is where the same body goes on the backend."""

    def __init__(
        self,
        state: GatewayState,
        upstream_path: str,
        slots: InFlightLimit,
        reading: ReadingBudget,
        observer: RequestObserver,
        tracing: Tracing,
        drain: Drain | None = None,
    ) -> None:
        self._state = state
        self._slots = slots
        self._reading = reading
        self._observer = observer
        self._tracing = tracing
        self._drain = drain or Drain()
        self.admission = Admission(state, tracing, chat=upstream_path.endswith("chat/completions"))
        self.forwarder = Forwarder(state, upstream_path, upstreams(state), tracing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        attempt = Attempt(request_id=request_id(scope), started=time.perf_counter())
        attempt.client_trace = attempt.upstream_trace = client_trace(scope["headers"])
        traced: RequestTrace | None = None
        if self._tracing.on:
            name = f"{scope['method']} {scope['path']}"
            traced = self._tracing.start_request(name, attempt.client_trace, _request_attributes(scope, attempt))
            attempt.trace_id = Tracing.trace_id(traced)
        payload: dict[str, Any] | None = None
        drain = self._drain
        task = asyncio.current_task()
        assert task is not None
        drain.enter(task, attempt)
        try:
            payload = await self._serve(scope, receive, send, attempt)
        except asyncio.CancelledError:
            if not drain.was_cut(task):
                raise
            task.uncancel()  # the drain's cancel is handled here: the answer still ends properly
            await end_cut(send, attempt)
        except Exception:
            log.exception("unhandled error on %s", scope["path"])
            if not attempt.status:
                attempt.status, attempt.error_code, attempt.refused = 500, "internal_error", True
                await send_json(send, 500, list(JSON_HEADERS), _INTERNAL_ERROR)
        finally:
            drain.leave(task)
            self._observer.finished(scope["method"], scope["path"], attempt, payload)
            if traced is not None:
                self._tracing.end_request(traced, _answer_attributes(attempt), failed=attempt.status >= 500)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, attempt: Attempt) -> dict[str, Any] | None:
        """Answer the request; returns its parsed body if it was admitted (the access log may show its prompt)."""
        if scope["method"] != "POST":
            await send_error(send, attempt, wrong_method(scope["method"], scope["path"], "POST"))
            return None
        if self._drain.draining:
            await refuse(send, attempt)
            return None
        state = self._state
        try:
            # The key first, then the whole body (within its deadline), and only then a slot.
            attempt.tenant = tenant = state.tenants.authenticate(header(scope, b"authorization"))
            body = await read_body(
                scope, receive, state.config.limits.max_body_bytes, state.config.timeouts.client_body_s, self._reading
            )
        except ApiError as error:
            # The body is not read (or not all of it): the connection cannot carry another request.
            error.headers["connection"] = "close"
            await send_error(send, attempt, error)
            return None
        if not self._slots.try_take():
            state.metrics.overloaded.inc()
            attempt.status, attempt.error_code, attempt.refused = 503, "overloaded", True
            await send_json(send, 503, [*JSON_HEADERS, (b"retry-after", b"1")], OVERLOADED)
            return None
        try:
            try:
                with self._tracing.phase("admission"):
                    admitted = await self.admission.admit(tenant, body, attempt)
            except ApiError as error:
                await send_error(send, attempt, error)
                return None
            await self.forwarder.forward(admitted, attempt, receive, send)
            return admitted.parsed.payload
        finally:
            self._slots.give_back()


def _request_attributes(scope: Scope, attempt: Attempt) -> dict[str, Any]:
    return {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "spillgate.request_id": attempt.request_id,
    }


def _answer_attributes(attempt: Attempt) -> dict[str, Any]:
    """What the request span says of the answer (OpenTelemetry's HTTP and generative-AI names where they exist)."""
    attributes: dict[str, Any] = {
        "http.response.status_code": attempt.status or CLIENT_CLOSED,
        "spillgate.outcome": attempt.outcome,
        "spillgate.stream": attempt.stream,
    }
    if attempt.error_code:
        attributes["error.type"] = attempt.error_code
    if attempt.tenant is not None:
        attributes["spillgate.tenant"] = attempt.tenant.name
    if attempt.route != "-":
        attributes["gen_ai.request.model"] = attempt.route
    if attempt.served_by is not None:
        attributes["spillgate.backend"] = attempt.backend
        attributes["spillgate.reason"] = attempt.reason
    usage = attempt.usage or {}
    for name, key in _USAGE_ATTRIBUTES:
        if isinstance(usage.get(key), int):
            attributes[name] = usage[key]
    return attributes


_USAGE_ATTRIBUTES = (
    ("gen_ai.usage.input_tokens", "prompt_tokens"),
    ("gen_ai.usage.output_tokens", "completion_tokens"),
)
