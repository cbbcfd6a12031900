"""Bytes on the wire: orjson JSON responses, and server-sent events as SGLang and OpenAI write
them (``data: {json}\\n\\n`` per event, then ``data: [DONE]\\n\\n``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


class OrjsonResponse(JSONResponse):
    """JSON via orjson (fast, and keeps non-ASCII text as UTF-8 like SGLang's responses)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def sse_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that always runs ``on_close`` when the stream ends.

    Starlette cancels the body iterator when the client disconnects, but depending on the ASGI
    spec version it may instead just stop iterating; ``on_close`` (aborting the request and
    freeing its KV) must run either way.
    """

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
