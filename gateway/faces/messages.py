"""Anthropic's Messages API (``POST /v1/messages``) through chat completions: not served yet."""

from __future__ import annotations

from typing import Any

from spillgate.gateway.errors import ApiError
from spillgate.gateway.faces.bridge import StreamTranslator
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Tenant


class MessagesFace:
    def __init__(self, state: GatewayState) -> None:
        self._state = state

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return headers

    async def request(self, tenant: Tenant | None, body: bytes) -> bytes:
        raise ApiError(404, "POST /v1/messages is not supported by this gateway yet.", code="unsupported_endpoint")

    async def whole(self, chat: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def stream(self) -> StreamTranslator:
        raise NotImplementedError

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        import orjson

        return orjson.dumps({"error": error})
