"""litellm's many exceptions, reduced to the few kinds the gateway acts on, with credentials scrubbed.

litellm's class and status are not enough on their own: it reports a refused connection as a 500
``InternalServerError`` and a broken stream as ``APIConnectionError`` or ``MidStreamFallbackError``.
So the cause chain is searched for the root cause first (refused connection, timeout, invalid JSON),
and only then is the provider's HTTP status used.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Literal

import httpx

from spillgate.backends.hosted.scrub import scrub

# rate_limited: 429 (see retry_after_s). server_error: 5xx. timeout: silence longer than timeout_s.
# connect: the provider could not be reached, or dropped the connection before answering.
# bad_request: any other 4xx (401/403 too: see status), with the provider's message.
# malformed: an answer that broke off: invalid JSON or SSE, a stream without a finish, a mid-stream drop.
ErrorKind = Literal["rate_limited", "server_error", "timeout", "connect", "bad_request", "malformed"]
_MAX_MESSAGE_CHARS = 500
_PREFIXES = re.compile(r"^(?:litellm\.\w+: |\w+Error: |\w+Exception(?: \w+Error)? - )+")
_HANDLE_WITH = re.compile(r"\.? Handle with `litellm\.\w+`\.?$")
_BROKEN_STREAM = ("stream ended before", "unable to get json response", "error parsing chunk", "error receiving chunk")


class HostedError(Exception):
    """A hosted request that failed, as the gateway needs to know it.

    ``streamed_anything`` says whether bytes had already been handed to the caller (then it cannot fall
    back to another backend invisibly). ``retry_after_s`` comes from the provider's Retry-After, if any.
    ``message`` never contains the model's credentials.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        model: str,
        status: int | None = None,
        retry_after_s: float | None = None,
        streamed_anything: bool = False,
    ) -> None:
        super().__init__(f"hosted model {model!r}: {kind}: {message}")
        self.kind: ErrorKind = kind
        self.message = message
        self.model = model
        self.status = status
        self.retry_after_s = retry_after_s
        self.streamed_anything = streamed_anything


def classify(exc: BaseException, *, model: str, secrets: tuple[str, ...], streamed_anything: bool) -> HostedError:
    """The HostedError for an exception raised by litellm (or by the relay's own checks)."""
    status = _provider_status(exc)
    kind = _root_kind(exc, streamed_anything) or _status_kind(status)
    retry_after = _retry_after_s(exc) if kind == "rate_limited" else None
    message = scrub(_provider_message(exc, kind), secrets)
    return HostedError(
        kind,
        message,
        model=model,
        status=status if kind in ("rate_limited", "server_error", "bad_request") else None,
        retry_after_s=retry_after,
        streamed_anything=streamed_anything,
    )


def silence(*, model: str, timeout_s: float, streamed_anything: bool) -> HostedError:
    """The HostedError for a provider that sent nothing for longer than the model's timeout."""
    message = f"no data from the provider for {timeout_s:g} s"
    return HostedError("timeout", message, model=model, streamed_anything=streamed_anything)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (cause, context, litellm's ``original_exception``)."""
    pending, seen = [exc], set()
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for inner in (current.__cause__, current.__context__, getattr(current, "original_exception", None)):
            if isinstance(inner, BaseException):
                pending.append(inner)


def _root_kind(exc: BaseException, streamed_anything: bool) -> ErrorKind | None:
    import openai  # litellm's dependency; imported here so that this package's root stays light

    chain = list(_chain(exc))
    if any(isinstance(e, ConnectionError | httpx.ConnectError | httpx.ConnectTimeout) for e in chain):
        return "connect" if not streamed_anything else "malformed"
    if any(type(e).__name__ in ("ClientConnectorError", "ServerDisconnectedError") for e in chain):
        return "connect" if not streamed_anything else "malformed"
    if any(isinstance(e, httpx.RemoteProtocolError | httpx.ReadError) for e in chain):  # a direct stream's drop
        return "connect" if not streamed_anything else "malformed"
    if any(isinstance(e, TimeoutError | httpx.TimeoutException) for e in chain):
        return "timeout"
    if any(isinstance(e, openai.APITimeoutError) for e in chain):
        return "timeout"
    if any(isinstance(e, json.JSONDecodeError | UnicodeDecodeError) for e in chain):
        return "malformed"
    text = " ".join(str(e).lower() for e in chain)
    if any(marker in text for marker in _BROKEN_STREAM):
        return "malformed"
    if streamed_anything and any(isinstance(e, openai.APIConnectionError) for e in chain):
        return "malformed"  # the connection broke mid-stream
    return None


def _status_kind(status: int | None) -> ErrorKind:
    if status == 429:
        return "rate_limited"
    if status is not None and 400 <= status < 500:
        return "bad_request"
    return "server_error"


def _provider_status(exc: BaseException) -> int | None:
    """The HTTP status the provider answered: an httpx status error's, else the outermost ``status_code``."""
    found = None
    for current in _chain(exc):
        if isinstance(current, httpx.HTTPStatusError):
            return current.response.status_code
        status = getattr(current, "status_code", None)
        if found is None and isinstance(status, int) and status >= 400:
            found = status
    return found


def _headers(exc: BaseException) -> Mapping[str, str]:
    for current in _chain(exc):
        for candidate in (getattr(current, "litellm_response_headers", None), _response_headers(current)):
            if candidate and ("retry-after" in candidate or "retry-after-ms" in candidate):
                return candidate
    return {}


def _response_headers(exc: BaseException) -> Mapping[str, str] | None:
    response = getattr(exc, "response", None)
    return getattr(response, "headers", None)


def _retry_after_s(exc: BaseException) -> float | None:
    """Retry-After (seconds or an HTTP date) or retry-after-ms, when the provider sent one."""
    headers = _headers(exc)
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            return max(float(milliseconds) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _provider_message(exc: BaseException, kind: ErrorKind) -> str:
    """The provider's own words when it sent an error body, else the root cause or litellm's message."""
    if kind == "connect":
        exc = list(_chain(exc))[-1]  # e.g. "[Errno 111] Connect call failed ('127.0.0.1', 1)"
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    text = _PREFIXES.sub("", text.strip()).split(" Original exception:")[0]
    text = _HANDLE_WITH.sub("", text)
    if text.startswith(("b'", 'b"')) and text.endswith(text[1]):
        text = text[2:-1]  # a body litellm shows as bytes
    start = text.find("{")
    if start != -1:
        try:
            body, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
    return text[:_MAX_MESSAGE_CHARS]
