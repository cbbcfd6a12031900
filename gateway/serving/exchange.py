"""One HTTP exchange on the hot path: its record, ASGI plumbing, and responses in OpenAI's shapes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from spillgate.backends.backend import Backend
from spillgate.backends.hosted import Price
from spillgate.gateway.dispatch.prefix import Fingerprint
from spillgate.gateway.errors import ApiError
from spillgate.gateway.observability.trace_context import TraceHeaders
from spillgate.gateway.serving.slots import READING_FULL_MESSAGE, ReadingBudget
from spillgate.gateway.tenancy.tenants import Tenant
from spillgate.policies.types import RouteRequest, Snapshot

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class TryElsewhere(Exception):
    """A backend failed before the client saw a byte: another candidate may take the request."""

    def __init__(self, error: ApiError, *, retryable: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.retryable = retryable


JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass(slots=True)
class Attempt:
    """What one request did, for the response headers, the metrics and the ledger. Its load on a backend is
    not here: each attempt's :class:`~gateway.dispatch.ticket.DispatchTicket` holds that."""

    request_id: str
    started: float
    route: str = "-"
    reference_price: Price | None = None
    """The route's hosted price: what the request would have cost there."""
    tenant: Tenant | None = None
    backend: str = "-"
    reason: str = "-"
    outcome: str = "error"
    cost_usd: float | None = None
    hosted_equivalent_usd: float | None = None
    """What the request would have cost on the route's hosted model; set once its usage is known."""
    worst_case_usd: float = 0.0
    """What was reserved against the tenant's budgets."""
    served_by: Backend | None = None
    """The backend last tried (its object, which outlives a config change that removes its name)."""
    first_token_at: float = 0.0
    usage: dict[str, Any] | None = None
    fingerprint: Fingerprint | None = None
    prefix_source: str = ""
    """What the chosen replica's prefix match came from (``events``, ``events+belief``, ``belief``); the
    ``x-spillgate-prefix-source`` header."""
    matched_blocks: dict[str, int] = field(default_factory=dict)
    prefix_tokens: dict[str, int] = field(default_factory=dict)
    stream: bool = False
    sent_at: float = 0.0
    """When the backend that answered was sent the request (after any hold), ``perf_counter``."""
    tpot_s: float | None = None
    decided_from: tuple[RouteRequest, Snapshot, str] | None = None
    """What the policy chose from, and what it chose: kept (immutable, so free to keep) for judging the
    prediction once the first token is in, off the hot path."""
    status: int = 0
    """The status sent to the client; 0 until the answer starts."""
    error_code: str = ""
    """The ``code`` of the error answered, or of the in-band error event that ended a stream."""
    refused: bool = False
    """The gateway wrote its error answer itself (a refusal, or its own 5xx when no backend could answer), rather
    than passing on a backend's verdict about the request."""
    client_trace: TraceHeaders = ()
    """The client's ``traceparent`` and ``tracestate``, checked (:mod:`gateway.observability.trace_context`)."""
    upstream_trace: TraceHeaders = ()
    """What the backend is sent of them: the client's, or with tracing on its upstream span's."""
    trace_id: str = ""
    """The request's trace while tracing is on (:mod:`gateway.observability.tracing`)."""
    rate_limits: tuple[tuple[bytes, bytes], ...] = ()
    """OpenAI's ``x-ratelimit-*`` headers for a tenant with per-minute limits, once it was charged
    (:mod:`gateway.serving.rate_headers`)."""


class DisconnectWatcher:
    """Cancels the request's task when the client disconnects, so its upstream request is dropped too.

    Only an ``http.disconnect`` message counts: the server may wake ``receive()`` for other reasons (an
    empty ``http.request`` after the body), and those must not end a healthy stream.
    """

    __slots__ = ("_active", "_owner", "_receive", "_task", "disconnected")

    def __init__(self, receive: Receive) -> None:
        self.disconnected = False
        self._active = True
        self._receive = receive
        self._owner = asyncio.current_task()
        self._task = self._listen()

    def _listen(self) -> asyncio.Future[dict[str, Any]]:
        task = asyncio.ensure_future(self._receive())
        task.add_done_callback(self._on_message)
        return task

    def _on_message(self, task: asyncio.Future[dict[str, Any]]) -> None:
        if not self._active or task.cancelled() or task.exception() is not None:
            return
        if task.result().get("type") != "http.disconnect":
            self._task = self._listen()
            return
        if self._owner is not None and not self._owner.done():
            self.disconnected = True
            self._owner.cancel()

    def stop(self) -> None:
        """The response is complete: a disconnect from now on is the normal end of the exchange."""
        self._active = False
        self._task.cancel()


async def read_body(
    scope: Scope, receive: Receive, limit: int, timeout_s: float, budget: ReadingBudget | None = None
) -> bytes:
    """The whole request body, at most ``limit`` bytes, arrived within ``timeout_s`` (else 413 or 408), its
    bytes counted in ``budget`` while it arrives (503 when that is full)."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_chunks(receive, limit, budget)
    except TimeoutError:
        raise ApiError(
            408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout"
        ) from None


async def _read_chunks(receive: Receive, limit: int, budget: ReadingBudget | None) -> bytes:
    chunks: list[bytes] = []
    size = 0
    counted = 0
    """Bytes taken from ``budget``: only chunks with more to come (a body in one piece costs nothing)."""
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "Client disconnected before sending the whole body.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
            if budget is not None:
                if not budget.take(len(chunk)):
                    raise ApiError(503, READING_FULL_MESSAGE, code="overloaded", headers={"retry-after": "1"})
                counted += len(chunk)
    finally:
        if budget is not None:
            budget.give_back(counted)


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body is larger than this gateway's limit of {limit} bytes.", code="request_too_large"
    )


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def request_id(scope: Scope) -> str:
    given = header(scope, b"x-request-id")
    if given and len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return os.urandom(12).hex()


def response_headers(attempt: Attempt, base: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    headers = [
        *base,
        (b"x-request-id", attempt.request_id.encode()),
        (b"x-spillgate-backend", attempt.backend.encode()),
        (b"x-spillgate-reason", attempt.reason.encode()),
    ]
    if attempt.prefix_source:
        headers.append((b"x-spillgate-prefix-source", attempt.prefix_source.encode()))
    if attempt.rate_limits:
        headers += attempt.rate_limits
    return headers


async def send_error(send: Send, attempt: Attempt, error: ApiError) -> None:
    """Answer with ``error``, which the gateway wrote itself (the attempt counts as refused)."""
    attempt.status, attempt.error_code, attempt.refused = error.status, error.code or "", True
    headers = response_headers(attempt, JSON_HEADERS) + [(k.encode(), v.encode()) for k, v in error.headers.items()]
    await send_json(send, error.status, headers, error.body())


async def send_answer(send: Send, attempt: Attempt, status: int, base: list[tuple[bytes, bytes]], body: bytes) -> None:
    """Answer whole with a backend's ``status`` and ``body``, the request's own headers added."""
    attempt.status = status
    await send_json(send, status, response_headers(attempt, base), body)


async def send_json(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
