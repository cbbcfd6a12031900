"""Relay a litellm stream (or a direct one's dicts) as OpenAI server-sent events, one event per chunk.

Nothing is buffered: each chunk is serialized and handed on at once. The relay also keeps what the
gateway needs afterwards (usage, cost, whether anything was sent) and turns every failure, including
silence longer than the model's ``timeout_s`` and a stream that ends without a finish reason, into a
HostedError.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from spillgate.backends.hosted.errors import HostedError, classify, silence
from spillgate.backends.hosted.model import HostedModel
from spillgate.backends.hosted.openai_format import chunk_json, usage_from
from spillgate.backends.hosted.response import Usage, cost_of

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class HostedStream:
    """An answer streaming in: iterate for SSE bytes (ending with ``data: [DONE]``), once.

    ``usage`` and ``cost_usd`` are set when the provider reported usage (at the end). ``include_usage``
    is what the client asked for: usage is always requested upstream, for the cost, but relayed only
    then. Call ``aclose()`` when the client goes away: it closes the upstream connection, which stops
    the generation (and the bill).
    """

    def __init__(self, model: HostedModel, source: Any, *, include_usage: bool) -> None:
        self.model = model
        self.usage: Usage | None = None
        self.cost_usd: float | None = None
        self.finish_reason: str | None = None
        self.streamed_anything = False
        self._source = source
        self._include_usage = include_usage
        self._events = self._relay()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events

    async def aclose(self) -> None:
        await self._events.aclose()
        await self._close_source()

    async def _close_source(self) -> None:
        with contextlib.suppress(Exception):
            await self._source.aclose()

    def _failure(self, exc: BaseException) -> HostedError:
        model = self.model
        return classify(exc, model=model.name, secrets=model.secrets(), streamed_anything=self.streamed_anything)

    async def _next_chunk(self, chunks: AsyncIterator[Any]) -> dict[str, Any] | None:
        """The next chunk as a dict, None at the end; at most ``timeout_s`` of silence."""
        try:
            async with asyncio.timeout(self.model.timeout_s):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            model = self.model
            raise silence(
                model=model.name, timeout_s=model.timeout_s, streamed_anything=self.streamed_anything
            ) from None
        except Exception as exc:
            raise self._failure(exc) from None
        return chunk if isinstance(chunk, dict) else chunk.model_dump()  # dicts from backends.hosted.direct

    def _record(self, raw: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk to relay (None: nothing to send), noting usage and the finish reason."""
        usage = usage_from(raw.get("usage"))
        if usage is not None:
            self.usage, self.cost_usd = usage, cost_of(usage, self.model.price)
        payload = chunk_json(raw)
        for choice in payload["choices"]:
            self.finish_reason = choice["finish_reason"] or self.finish_reason
        if usage is not None and self._include_usage:
            payload["usage"] = usage.to_openai()
        elif not payload["choices"]:
            return None
        return payload

    async def _relay(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._source)
        try:
            while (raw := await self._next_chunk(chunks)) is not None:
                payload = self._record(raw)
                if payload is not None:
                    self.streamed_anything = True
                    yield sse(payload)
            if self.finish_reason is None:
                raise HostedError(
                    "malformed",
                    "the stream ended before a finish_reason",
                    model=self.model.name,
                    streamed_anything=self.streamed_anything,
                )
            yield DONE
        finally:
            await self._close_source()
