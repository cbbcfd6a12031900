"""Anthropic's Messages API (``POST /v1/messages``) served through chat completions.

The face translates and nothing more (:mod:`gateway.faces.bridge`): the request in
:mod:`~gateway.faces.messages_request`, the answer in :mod:`~gateway.faces.messages_answer` and
:mod:`~gateway.faces.messages_stream`, errors in :mod:`~gateway.faces.messages_errors`. Anthropic's
``x-api-key`` is the tenant's key; ``anthropic-version`` and ``anthropic-beta`` are accepted and need nothing.
"""

from __future__ import annotations

import functools
from typing import Any

import orjson

from spillgate.backends.hosted.pricing import is_anthropic
from spillgate.gateway.faces.bridge import StreamTranslator
from spillgate.gateway.faces.messages_answer import whole_message
from spillgate.gateway.faces.messages_errors import error_body
from spillgate.gateway.faces.messages_request import MessagesRequest, translate_request
from spillgate.gateway.faces.messages_stream import MessagesStream
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Tenant

_anthropic = functools.lru_cache(maxsize=1024)(is_anthropic)
"""Whether a litellm model is Anthropic's, asked once per model."""


class MessagesFace:
    """Anthropic's Messages API (:class:`~gateway.faces.bridge.Face`)."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state

    def exchange(self) -> MessagesExchange:
        return MessagesExchange(self._state)


class MessagesExchange:
    """One Messages request's translation: the answer needs the model the client named and its stop sequences."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._asked: MessagesRequest | None = None

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``x-api-key: K`` read as ``authorization: Bearer K`` (an ``authorization`` header wins)."""
        if any(name == b"authorization" for name, _ in headers):
            return headers
        for name, value in headers:
            if name == b"x-api-key":
                return [*headers, (b"authorization", b"Bearer " + value.strip())]
        return headers

    async def request(self, tenant: Tenant | None, body: bytes) -> bytes:
        asked = translate_request(body, self._state.config.limits, lambda model: self._caching(model, tenant))
        self._asked = asked
        return orjson.dumps(asked.chat)

    def _caching(self, model: str, tenant: Tenant | None) -> bool:
        """Whether the route may send the request to one of Anthropic's models, which take ``cache_control``."""
        state = self._state
        route = state.routes.get(model)
        if route is None:
            return False
        targets = route.targets_for(tenant.name) if tenant is not None else route.targets
        hosted = state.hosted_models
        return any(name in hosted and _anthropic(hosted[name].litellm_model) for name in targets)

    async def whole(self, chat: dict[str, Any]) -> bytes:
        asked = self._asked
        model = asked.model if asked is not None else str(chat.get("model") or "")
        return orjson.dumps(whole_message(chat, model, asked.stop_sequences if asked is not None else ()))

    def stream(self) -> StreamTranslator:
        asked = self._asked
        if asked is None:
            return MessagesStream("", ())
        return MessagesStream(asked.model, asked.stop_sequences)

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return error_body(status, error)

    def status(self, status: int) -> int:
        """Anthropic's API answers a well-formed request it cannot take with 400 (its SDK has no 422 for it)."""
        return 400 if status == 422 else status
