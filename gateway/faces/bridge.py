"""Serving another API's shape through the chat-completions path.

A face (Anthropic's Messages, OpenAI's Responses) is a translation, not a second pipeline: its request body
becomes a chat-completions body, the chat handler does everything a chat request gets (tenant, limits,
routing, spill, retries, booking, metrics, access log), and what the handler sends back is translated on the
way out, whole or event by event. The body still arrives through the handler's own reader, so its size limit,
deadline and reading budget apply unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from spillgate.gateway.errors import ApiError
from spillgate.gateway.serving.exchange import Receive, Scope, Send
from spillgate.gateway.tenancy.tenants import Tenant

ChatHandler = Callable[[Scope, Receive, Send], Awaitable[None]]


class StreamTranslator(Protocol):
    """Turns the chat stream's chunks into the face's events, one call per chunk."""

    async def chunk(self, chunk: dict[str, Any]) -> bytes:
        """The face's events (SSE bytes, possibly empty) for one chat-completions chunk."""
        ...

    async def end(self, error: dict[str, Any] | None) -> bytes:
        """The face's closing events; ``error`` is the OpenAI error object that ended the stream, if one did."""
        ...


class FaceExchange(Protocol):
    """One request's translation: what the answer needs of the request (the model the client named, its stop
    sequences, its stored conversation) lives here, from the request to the answer."""

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The request headers the chat handler sees (e.g. ``x-api-key`` as ``authorization``)."""
        ...

    async def request(self, tenant: Tenant | None, body: bytes) -> bytes:
        """The chat-completions body for the face's request body; raises :class:`ApiError` for bad input."""
        ...

    async def whole(self, chat: dict[str, Any]) -> bytes:
        """The face's body for a whole successful chat answer."""
        ...

    def stream(self) -> StreamTranslator:
        """A translator for the streamed answer."""
        ...

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        """The face's error body for an OpenAI error object."""
        ...

    def status(self, status: int) -> int:
        """The status the face answers an error with (Anthropic's API uses 400 where chat completions use 422)."""
        ...


class Face(Protocol):
    """One API shape served through chat completions."""

    def exchange(self) -> FaceExchange:
        """The translation of one request."""
        ...


class FaceHandler:
    """An ASGI handler serving ``face`` through ``chat`` (the chat-completions handler)."""

    def __init__(self, face: Face, chat: ChatHandler, authenticate: Callable[[str | None], Tenant]) -> None:
        self._face = face
        self._chat = chat
        self._authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        face = self._face.exchange()
        scope = {**scope, "headers": face.headers(scope["headers"])}
        exchange = _Exchange(face, send)
        translated = False

        async def translated_receive() -> dict[str, Any]:
            # The handler reads the body once, after the key; translate it when it is whole. Later messages
            # (the disconnect watcher's) pass as they come.
            nonlocal translated
            if translated:
                return await receive()
            chunks: list[bytes] = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return message
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            translated = True
            try:
                tenant = self._authenticate(_authorization(scope))
            except ApiError:
                tenant = None
            body = await face.request(tenant, b"".join(chunks))
            return {"type": "http.request", "body": body, "more_body": False}

        await self._chat(scope, translated_receive, exchange.send)


class _Exchange:
    """The chat handler's answer, translated as it is sent."""

    def __init__(self, face: FaceExchange, send: Send) -> None:
        self._face = face
        self._send = send
        self._start: dict[str, Any] | None = None
        self._stream: StreamTranslator | None = None
        self._whole: list[bytes] = []
        self._pending = b""
        self._error: dict[str, Any] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._start = message
            if message["status"] < 300 and _is_event_stream(message["headers"]):
                self._stream = self._face.stream()
                await self._send(message)
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        if self._stream is not None:
            await self._stream_body(message)
        else:
            await self._whole_body(message)

    async def _whole_body(self, message: dict[str, Any]) -> None:
        self._whole.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        start = self._start
        assert start is not None
        status = start["status"]
        parsed = _json_object(b"".join(self._whole))
        if status < 300 and parsed is not None:
            body = await self._face.whole(parsed)
        else:
            error = parsed.get("error") if parsed is not None else None
            if not isinstance(error, dict):
                status = max(status, 502)  # a success the face cannot read is the gateway's failure
                error = {"message": "The backend's answer could not be read.", "type": "api_error"}
            body = self._face.error(status, error)
            status = self._face.status(status)
        headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**start, "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def _stream_body(self, message: dict[str, Any]) -> None:
        stream = self._stream
        assert stream is not None
        data = self._pending + message.get("body", b"")
        events, _, self._pending = data.rpartition(b"\n\n")
        out: list[bytes] = []
        for event in events.split(b"\n\n") if events else ():
            payload = _event_data(event)
            if payload is None or payload == b"[DONE]":
                continue
            chunk = _json_object(payload)
            if chunk is None:
                continue
            if isinstance(chunk.get("error"), dict) and not chunk.get("choices"):
                self._error = chunk["error"]
                continue
            out.append(await stream.chunk(chunk))
        more = message.get("more_body", False)
        if not more:
            out.append(await stream.end(self._error))
        body = b"".join(out)
        if body or not more:
            await self._send({"type": "http.response.body", "body": body, "more_body": more})


def _authorization(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"authorization":
            return value.decode("latin-1")
    return None


def _is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


def _event_data(event: bytes) -> bytes | None:
    lines = [line[6:] if line[5:6] == b" " else line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with a name, as Anthropic's and OpenAI's Responses streams write them."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
