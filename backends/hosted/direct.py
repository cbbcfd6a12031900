"""Requests to OpenAI-compatible providers, without litellm: streams relayed event by event, whole answers.

Through litellm every streamed chunk is parsed into the OpenAI SDK's typed objects and converted again:
about 0.6 ms of CPU per chunk on a 2-core VM (``tests.hosted.overhead``), 0.3 s for a 500-token reply,
which caps what a gateway process can spill in a burst. A provider that already speaks OpenAI's wire
format needs none of that: the events are parsed as JSON and go through the same :class:`HostedStream`
(the same OpenAI fields, usage, cost, silence timeout and error kinds) as litellm's.

Whole answers skip litellm's conversion too (about 6 ms of CPU each through it). Only for ``openai/`` models
(OpenAI itself, or any OpenAI-compatible ``api_base``) without extra litellm ``params``; other providers
still go through litellm.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson

from spillgate.backends.hosted.model import HostedModel

OPENAI_API_BASE = "https://api.openai.com/v1"
_PREFIX = "openai/"

KEEP_ALIVE_S = 4.0
"""How long an idle pooled connection to a provider is reused. Shorter than the idle timeout of the servers it
meets (uvicorn's 5 s is the shortest common one; OpenAI's and Anthropic's fronts keep theirs longer): a
connection the server has already closed, or is closing as the request leaves, is the classic keep-alive race,
answered by "Server disconnected without sending a response" and, before any fallback, a 502."""
_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=KEEP_ALIVE_S)
"""Streams to hosted providers at once: a burst spills hundreds (httpx's default pool stops at 100)."""
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""Raised by ``send`` before a response's first byte when the pooled connection it took had been closed by the
server: nothing reached the provider's application, so the request is sent once more on a new connection."""


def new_http_client() -> httpx.AsyncClient:
    """The gateway's one client for direct provider requests (see :data:`KEEP_ALIVE_S`)."""
    return httpx.AsyncClient(limits=_LIMITS)


def relays_directly(model: HostedModel) -> bool:
    """Whether ``model``'s requests skip litellm: an ``openai/`` model with no provider-specific parameters."""
    return model.litellm_model.startswith(_PREFIX) and not model.params


async def open_stream(http: httpx.AsyncClient, model: HostedModel, arguments: Mapping[str, Any]) -> Events:
    """POST a streamed request and return its chunks as dicts once the provider has answered 200.

    ``arguments`` are the request's OpenAI fields (:func:`backends.hosted.client.request_arguments`).
    A refusal raises ``httpx.HTTPStatusError`` carrying the provider's body, for
    :func:`backends.hosted.errors.classify` to read its status, message and Retry-After.
    """
    return Events(await _send(http, model, arguments, stream=True))


async def answer(http: httpx.AsyncClient, model: HostedModel, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """POST a whole (non-streamed) request and return the provider's ``chat.completion`` as a dict; errors as
    :func:`open_stream`'s, and an unparsable body as ``orjson.JSONDecodeError``."""
    response = await _send(http, model, arguments, stream=False)
    try:
        body = orjson.loads(await response.aread())
    finally:
        await response.aclose()
    if not isinstance(body, dict):
        raise orjson.JSONDecodeError("a chat.completion must be a JSON object", "", 0)
    return body


async def _send(
    http: httpx.AsyncClient, model: HostedModel, arguments: Mapping[str, Any], *, stream: bool
) -> httpx.Response:
    body = {key: value for key, value in arguments.items() if key not in _LITELLM_ONLY}
    body["model"] = model.litellm_model.removeprefix(_PREFIX)
    if "messages" in body:
        body["messages"] = _without_cache_control(body["messages"])
    headers = {
        **arguments.get("extra_headers", {}),
        "content-type": "application/json",
        "accept": "text/event-stream" if stream else "application/json",
    }
    if model.api_key:
        headers["authorization"] = f"Bearer {model.api_key}"
    url = (model.api_base or OPENAI_API_BASE).rstrip("/") + "/chat/completions"
    timeout = httpx.Timeout(model.timeout_s, connect=model.connect_timeout_s)
    request = http.build_request("POST", url, content=orjson.dumps(body), headers=headers, timeout=timeout)
    try:
        response = await http.send(request, stream=True)
    except _STALE:
        # Closed under us before answering (a stale keep-alive connection): once more, on a fresh one.
        response = await http.send(request, stream=True)
    if response.status_code != 200:
        try:
            text = (await response.aread()).decode(errors="replace")
        finally:
            await response.aclose()
        raise httpx.HTTPStatusError(text or response.reason_phrase, request=request, response=response)
    return response


class Events:
    """A streaming response's server-sent events as dicts, until ``[DONE]``. ``aclose()`` closes the connection
    (which stops the generation), also when iteration never started."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = self._parse()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._chunks

    async def aclose(self) -> None:
        await self._chunks.aclose()
        with contextlib.suppress(Exception):
            await self._response.aclose()

    async def _parse(self) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in self._response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # comments, event names, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                yield orjson.loads(data)
        finally:
            with contextlib.suppress(Exception):
                await self._response.aclose()


_LITELLM_ONLY = frozenset(
    {"api_base", "api_key", "timeout", "num_retries", "max_retries", "drop_params", "model", "extra_headers"}
)
"""litellm's own arguments among :func:`~backends.hosted.client.request_arguments` (and the headers
:func:`~backends.hosted.client.complete` adds): never sent in the body."""


def _without_cache_control(messages: Any) -> Any:
    """Anthropic's ``cache_control`` marks dropped from messages and their content parts, as litellm drops them for
    OpenAI: a route that reaches both an Anthropic model and an OpenAI-compatible one keeps them for the first only.
    ``messages`` is returned as it is when it has none (the usual case: one pass over the parts, no copy)."""
    if not isinstance(messages, list) or not any(_marked(message) for message in messages):
        return messages
    return [_unmarked(message) for message in messages]


def _marked(message: Any) -> bool:
    if not isinstance(message, dict):
        return False
    content = message.get("content")
    parts = content if isinstance(content, list) else ()
    return "cache_control" in message or any(isinstance(p, dict) and "cache_control" in p for p in parts)


def _unmarked(message: Any) -> Any:
    if not _marked(message):
        return message
    cleaned = {k: v for k, v in message.items() if k != "cache_control"}
    if isinstance(cleaned.get("content"), list):
        cleaned["content"] = [
            {k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p
            for p in cleaned["content"]
        ]
    return cleaned
