"""Anthropic's Messages API (``POST /v1/messages``) served through chat completions.

The face translates and nothing more (:mod:`gateway.faces.bridge`): the request in
:mod:`~gateway.faces.messages_request`, the answer in :mod:`~gateway.faces.messages_answer` and
:mod:`~gateway.faces.messages_stream`, errors in :mod:`~gateway.faces.messages_errors`. Anthropic's
``x-api-key`` is the tenant's key; ``anthropic-version`` and ``anthropic-beta`` are accepted and need nothing.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import orjson

from spillgate.gateway.faces.bridge import StreamTranslator
from spillgate.gateway.faces.messages_answer import whole_message
from spillgate.gateway.faces.messages_errors import error_body
from spillgate.gateway.faces.messages_request import MessagesRequest, translate_request
from spillgate.gateway.faces.messages_stream import MessagesStream
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Tenant

_ASKED: ContextVar[MessagesRequest | None] = ContextVar("spillgate_messages_request", default=None)
"""The request being answered. The bridge asks the face for its request, then for its answer, within one
request's task (the body is read and the answer sent there): the answer's translation reads the model the
client named and its stop sequences from here."""


class MessagesFace:
    """Anthropic's Messages API, one instance for every request (what differs per request is in ``_ASKED``)."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``x-api-key: K`` read as ``authorization: Bearer K`` (an ``authorization`` header wins)."""
        if any(name == b"authorization" for name, _ in headers):
            return headers
        for name, value in headers:
            if name == b"x-api-key":
                return [*headers, (b"authorization", b"Bearer " + value.strip())]
        return headers

    async def request(self, tenant: Tenant | None, body: bytes) -> bytes:
        asked = translate_request(body, self._state.config.limits)
        _ASKED.set(asked)
        return orjson.dumps(asked.chat)

    async def whole(self, chat: dict[str, Any]) -> bytes:
        asked = _ASKED.get()
        model = asked.model if asked is not None else str(chat.get("model") or "")
        return orjson.dumps(whole_message(chat, model, asked.stop_sequences if asked is not None else ()))

    def stream(self) -> StreamTranslator:
        asked = _ASKED.get()
        if asked is None:
            return MessagesStream("", ())
        return MessagesStream(asked.model, asked.stop_sequences)

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return error_body(status, error)
