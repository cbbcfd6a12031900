"""``POST /v1/embeddings`` (not served yet)."""

from __future__ import annotations

from spillgate.gateway.errors import error_body
from spillgate.gateway.serving.exchange import JSON_HEADERS, Receive, Scope, Send, send_json
from spillgate.gateway.state import GatewayState


class EmbeddingsHandler:
    def __init__(self, state: GatewayState, *hot: object) -> None:
        self._state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = error_body(404, "POST /v1/embeddings is not supported by this gateway yet.", code="unsupported_endpoint")
        await send_json(send, 404, list(JSON_HEADERS), body)
