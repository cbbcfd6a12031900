"""Relaying a backend's answer to the client: whole or event by event, and its failures in OpenAI's shapes.

A stream's status and headers leave with its first event, so a backend that fails or sends something else
before it can still be replaced by another candidate; after that, a failure is reported in-band, the way OpenAI
reports mid-stream errors. Nothing waits to fill a buffer. A failure before the first byte raises
:class:`~gateway.serving.exchange.TryElsewhere`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson

from spillgate.backends.backend import Backend
from spillgate.backends.hosted.scrub import scrub
from spillgate.backends.http1 import HttpError, Response
from spillgate.gateway.errors import ApiError, error_body
from spillgate.gateway.serving.exchange import (
    JSON_HEADERS,
    SSE_HEADERS,
    Attempt,
    Send,
    TryElsewhere,
    response_headers,
    send_answer,
)
from spillgate.gateway.serving.sse import EventRelay, InvalidEvent, carries_text
from spillgate.gateway.serving.upstream import UpstreamCall

log = logging.getLogger("spillgate.serving")

Failure = HttpError | InvalidEvent | str
OnFailure = Callable[[Failure], ApiError]
"""Told how the backend failed (for its outlier detection and the log); returns what the client is told."""
OnAnswer = Callable[[], None]
"""Told the backend answered in full, before the last bytes go to the client (who may leave meanwhile)."""


async def start_stream(attempt: Attempt, send: Send) -> None:
    attempt.status = 200
    await send({"type": "http.response.start", "status": 200, "headers": response_headers(attempt, SSE_HEADERS)})


async def send_event_error(send: Send, attempt: Attempt, error: ApiError) -> None:
    """End a stream whose headers are gone with an error event."""
    attempt.error_code = error.code or ""
    await send({"type": "http.response.body", "body": b"data: " + error.body() + b"\n\n", "more_body": False})


async def relay_whole(call: UpstreamCall, response: Response, failed: OnFailure, answered: OnAnswer) -> str:
    """Read the whole answer, and relay it only if it is a completion: anything else is the backend's failure,
    which another candidate may make good, since the client has seen nothing yet."""
    try:
        body = await response.read()
    except HttpError as exc:
        raise TryElsewhere(failed(exc), retryable=True) from None
    completion = _completion_of(body)
    if completion is None:
        raise TryElsewhere(failed(f"a {response.status} body that is not a completion: {body[:40]!r}"), retryable=True)
    if "metadata" in completion and openai_metadata(completion):
        body = orjson.dumps(completion)
    attempt = call.attempt
    attempt.first_token_at = call.ticket.first_token()
    usage = completion.get("usage")
    attempt.usage = usage if isinstance(usage, dict) else None
    call.ticket.reported(attempt.usage)
    answered()
    await send_answer(call.send, attempt, response.status, JSON_HEADERS, body)
    return "ok"


async def relay_embeddings(call: UpstreamCall, response: Response, failed: OnFailure, answered: OnAnswer) -> str:
    """Read a whole embeddings answer and relay it as it came, if it is one (a ``data`` list): else the backend
    failed, and another candidate may take the request. Its usage is booked with no output tokens."""
    try:
        body = await response.read()
    except HttpError as exc:
        raise TryElsewhere(failed(exc), retryable=True) from None
    answer = _embeddings_of(body)
    if answer is None:
        raise TryElsewhere(failed(f"a {response.status} body that is not embeddings: {body[:40]!r}"), retryable=True)
    attempt = call.attempt
    attempt.first_token_at = call.ticket.first_token()
    attempt.usage = embedding_usage(answer.get("usage"))
    call.ticket.reported(attempt.usage)
    answered()
    await send_answer(call.send, attempt, response.status, JSON_HEADERS, body)
    return "ok"


def embedding_usage(usage: object) -> dict[str, Any] | None:
    """An embeddings answer's usage as the books read a completion's: its prompt tokens, no output."""
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    prompt = usage["prompt_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}


def _embeddings_of(body: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("data"), list):
        return None
    return parsed


async def relay_stream(call: UpstreamCall, response: Response, failed: OnFailure, answered: OnAnswer) -> str:
    """Relay event by event, each checked (:mod:`gateway.serving.sse`); the usage chunk is kept from a client
    that did not ask for it."""
    attempt, ticket, send = call.attempt, call.ticket, call.send
    relay = EventRelay(strip_usage=not call.parsed.include_usage)
    started = False
    try:
        async for data in response.iter_bytes():
            events = relay.feed(data)
            if not events:
                continue
            if not started:
                await start_stream(attempt, send)
                started = True
            if not attempt.first_token_at:
                attempt.first_token_at = ticket.first_token()
            if ticket.wants_text and carries_text(events):
                ticket.saw_text()
            await send({"type": "http.response.body", "body": events, "more_body": True})
        tail = relay.flush()
        if not started and not relay.events and not tail.strip():
            raise InvalidEvent("a stream without a single event")
    except (HttpError, InvalidEvent) as exc:
        error = failed(exc)
        if not started:
            raise TryElsewhere(error, retryable=True) from None
        await send_event_error(send, attempt, error)
        return "error"
    if not started:
        await start_stream(attempt, send)
    answered()
    await send({"type": "http.response.body", "body": tail})
    attempt.usage = relay.usage
    return "ok"


async def relay_client_error(call: UpstreamCall, response: Response) -> str:
    """A 4xx from the backend is about the request: pass it on, in OpenAI's shape."""
    try:
        body = await response.read()
    except HttpError:
        body = b""
    body = as_openai_error(body, response.status, call.ticket.backend)
    await send_answer(call.send, call.attempt, response.status, JSON_HEADERS, body)
    return "client_error"


def _completion_of(body: bytes) -> dict[str, Any] | None:
    """The completion a backend answered, or None when the body is not one (not JSON, or no ``choices``)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list):
        return None
    return parsed


def openai_metadata(completion: dict[str, Any]) -> bool:
    """Make a whole answer's ``metadata`` OpenAI's: a map of strings (what a client stored with the request). SGLang
    sends its own there, ``{"weight_version": "default", "weight_versions": [{...}]}``, whose list makes the ``openai``
    SDK warn whenever it serialises the answer: the entries that are not strings go, ``weight_version`` stays.
    Streamed chunks carry no ``metadata``. Returns whether the answer changed."""
    metadata = completion["metadata"]
    if isinstance(metadata, dict):
        kept = {key: value for key, value in metadata.items() if isinstance(value, str)}
        if len(kept) == len(metadata):
            return False
        completion["metadata"] = kept
    elif metadata is not None:
        del completion["metadata"]
    else:
        return False
    return True


def as_openai_error(body: bytes, status: int, backend: Backend) -> bytes:
    """A replica's 4xx body in OpenAI's shape with the engine's message kept (SGLang writes it flat, vLLM as
    OpenAI does), else a generic refusal. The message is scrubbed of the replica's key and anything shaped like a
    credential (a server may echo what it was sent), and names no replica: the log does."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    found = backend.engine.error_message(parsed)
    if found is not None:
        message, param = found
        message = conceal(scrub(message, (backend.api_key,) if backend.api_key else ()), backend)
        log.info("backend %s refused a request (%s): %s", backend.name, status, message)
        return error_body(status, message, param=param)
    log.info("backend %s refused a request (%s) without a readable reason", backend.name, status)
    return error_body(status, "The backend refused the request.", code="backend_refused")


def conceal(message: str, backend: Backend) -> str:
    """``message`` without the replica's address or name (an engine may repeat where it listens): the tenant is
    told "the backend", the log and the admin API say which."""
    address = backend.base_url.rstrip("/")
    parts = urlsplit(address)
    # Longest first: a replica's name holds its host:port (``pool/host:port``), which must go with it.
    for shown in sorted((address, parts.netloc, parts.hostname or "", backend.name), key=len, reverse=True):
        if shown and shown in message:
            message = message.replace(shown, "the backend")
    return message
