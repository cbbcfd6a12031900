"""Send one streamed chat completion and measure it from the client's side.

Uses the project's own HTTP/1.1 client rather than httpx: on a small machine the load generator's own cost
per token would otherwise show up in the latencies it reports. SSE is parsed here, event by event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import orjson

from spillgate.backends.http1 import Http1Client, HttpError
from spillgate.gateway.bench.workloads import RequestSpec

BACKEND_HEADER = b"x-spillgate-backend"
REASON_HEADER = b"x-spillgate-reason"
_ERROR_BODY_LIMIT = 300


@dataclass(slots=True)
class RequestResult:
    """What one request did. Times are seconds; ``start`` is from the start of its level, and ``scheduled``
    is the arrival time an open-loop schedule gave it (``None`` in closed loop)."""

    start: float
    scheduled: float | None = None
    ok: bool = False
    status: int = 0
    error: str | None = None
    """``http_<status>``, ``connect``, ``timeout``, ``protocol``, ``stream_error`` or ``incomplete``."""
    detail: str = ""
    backend: str = "-"
    reason: str = "-"
    """The gateway's ``x-spillgate-reason`` (why that backend: ``least_ttft``, ``overflow``, ...)."""
    ttft: float | None = None
    tpot: float | None = None
    e2e: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reply: str | None = None
    session: int | None = None
    """chat and agent: the conversation this turn belongs to (its turns are sent in order)."""


def api_paths(url: str) -> tuple[str, str]:
    """The origin to connect to and the chat completions path, for a base URL with or without ``/v1``."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base, "/v1/chat/completions"


class ChatClient:
    """Streams chat completions to OpenAI-compatible URLs over pooled keep-alive connections; with several URLs
    (the processes of one gateway), each request goes to the next one in turn."""

    def __init__(
        self, urls: Sequence[str], *, model: str, api_key: str | None, request_timeout: float, connect_timeout: float
    ):
        if not urls:
            raise ValueError("ChatClient needs at least one URL")
        self._targets = [api_paths(url) for url in urls]
        self._turn = 0
        self._model = model
        self._timeout = request_timeout
        self._http = Http1Client(connect_timeout=connect_timeout, read_timeout=request_timeout)
        # content-type is required by some routers (sglang-router); accept keeps proxies from buffering.
        headers = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
        if api_key:
            headers.append((b"authorization", b"Bearer " + api_key.encode()))
        self._headers = headers

    def body(self, spec: RequestSpec) -> bytes:
        return orjson.dumps(
            {
                "model": self._model,
                "messages": spec.messages,
                "max_tokens": spec.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,  # SGLang extra: generate exactly max_tokens, so output lengths are the workload's
            }
        )

    async def send(self, spec: RequestSpec, origin: float) -> RequestResult:
        """Run ``spec`` to completion, bounded by the request timeout; never raises except on cancellation."""
        body = self.body(spec)
        sent = time.perf_counter()
        result = RequestResult(start=sent - origin)
        try:
            async with asyncio.timeout(self._timeout):
                base, path = self._targets[self._turn % len(self._targets)]
                self._turn += 1
                response = await self._http.post(base, path, body, self._headers)
                try:
                    result.status = response.status
                    for name, value in response.headers:
                        if name == BACKEND_HEADER:
                            result.backend = value.decode(errors="replace")
                        elif name == REASON_HEADER:
                            result.reason = value.decode(errors="replace")
                    if response.status != 200:
                        result.error = f"http_{response.status}"
                        result.detail = _error_message(await response.read())
                    else:
                        await _read_stream(response.iter_bytes(), result, sent, keep_reply=spec.session is not None)
                finally:
                    response.close()
        except TimeoutError:
            result.error, result.detail = "timeout", f"no complete answer within {self._timeout:g}s"
        except HttpError as exc:
            result.error, result.detail = exc.kind, str(exc)
        result.e2e = time.perf_counter() - sent
        result.ok = result.error is None
        return result

    def close(self) -> None:
        self._http.close()


class _Stream:
    """Per-request SSE state: token times, usage and the reply text."""

    __slots__ = ("chunks", "done", "first", "last", "parts")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.chunks = 0
        self.done = False
        self.parts: list[str] = []


async def _read_stream(body: AsyncIterator[bytes], result: RequestResult, sent: float, *, keep_reply: bool) -> None:
    stream = _Stream()
    buffer = b""
    async for data in body:
        buffer = buffer + data if buffer else data
        if b"\r" in data:
            buffer = buffer.replace(b"\r\n", b"\n")
        while (end := buffer.find(b"\n\n")) >= 0:
            event, buffer = buffer[:end], buffer[end + 2 :]
            _handle_event(event, stream, result, keep_reply)
            if result.error is not None:
                return
    if buffer.strip():
        _handle_event(buffer, stream, result, keep_reply)
    if result.error is None and not stream.done:
        result.error, result.detail = "incomplete", "the stream ended without data: [DONE]"
    if stream.first is not None:
        result.ttft = stream.first - sent
    if not result.completion_tokens:
        result.completion_tokens = stream.chunks  # no usage chunk: one token per content chunk
    if stream.first is not None and result.completion_tokens > 1 and stream.last > stream.first:
        result.tpot = (stream.last - stream.first) / (result.completion_tokens - 1)
    if keep_reply:
        result.reply = "".join(stream.parts)


def _handle_event(event: bytes, stream: _Stream, result: RequestResult, keep_reply: bool) -> None:
    payload = b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
    if not payload:
        return
    if payload == b"[DONE]":
        stream.done = True
        return
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        result.error, result.detail = "protocol", "an SSE event is not JSON"
        return
    if not isinstance(chunk, dict):
        return
    if chunk.get("error"):
        result.error, result.detail = "stream_error", _error_message(payload)
        return
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        content = delta.get("content") or delta.get("reasoning_content")
        if content:
            now = time.perf_counter()
            if stream.first is None:
                stream.first = now
            stream.last = now
            stream.chunks += 1
            if keep_reply and delta.get("content"):
                stream.parts.append(delta["content"])
    usage = chunk.get("usage")
    if usage:
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = int(details.get("cached_tokens") or 0)


def _error_message(body: bytes) -> str:
    """The OpenAI error message when the body is one, else the start of the body."""
    try:
        data = orjson.loads(body)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data.get("error")
        if message:
            return str(message)[:_ERROR_BODY_LIMIT]
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        pass
    return body[:_ERROR_BODY_LIMIT].decode(errors="replace")
