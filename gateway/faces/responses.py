"""OpenAI's Responses API (``POST /v1/responses``) through chat completions.

The request becomes a chat body (:mod:`.responses_request`): instructions, then the conversation stored under
``previous_response_id`` (:mod:`.response_store`), then the new input. The chat handler does the rest, and its
answer becomes a Responses object (:mod:`.responses_output`) or event stream (:mod:`.responses_stream`); with
``store`` (the default) the response and its conversation are kept for the next turn.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from spillgate.gateway.errors import ApiError
from spillgate.gateway.faces.bridge import StreamTranslator
from spillgate.gateway.faces.response_store import StoredResponse, StoreUnavailable
from spillgate.gateway.faces.response_store_choice import ResponseStores, stores_for
from spillgate.gateway.faces.responses_output import (
    Answer,
    Turn,
    answer_of,
    output_items,
    response_object,
    status_of,
)
from spillgate.gateway.faces.responses_request import assistant_message, chat_body, invalid, parse_request
from spillgate.gateway.faces.responses_stream import ResponsesStream
from spillgate.gateway.serving.validation import parse_json_object
from spillgate.gateway.state import GatewayState
from spillgate.gateway.tenancy.tenants import Tenant

log = logging.getLogger("spillgate.responses")


class ResponsesFace:
    """The Responses face (:class:`~gateway.faces.bridge.Face`)."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._stores: ResponseStores = stores_for(state)

    def exchange(self) -> ResponsesExchange:
        return ResponsesExchange(self._state, self._stores)


class ResponsesExchange:
    """One Responses request's translation: its turn (parsed request, tenant, stored history) once read."""

    def __init__(self, state: GatewayState, stores: ResponseStores) -> None:
        self._state = state
        self._stores = stores
        self._turn_read: Turn | None = None

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return headers

    async def request(self, tenant: Tenant | None, body: bytes) -> bytes:
        if tenant is None:
            raise ApiError(401, "A valid API key is required.", code="invalid_api_key")
        request = parse_request(parse_json_object(body), self._state.config.limits.max_tokens)
        history: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            history = await self._history(tenant.name, request.previous_response_id)
        self._turn_read = Turn(request=request, tenant=tenant.name, history=history)
        return orjson.dumps(chat_body(request, history))

    async def whole(self, chat: dict[str, Any]) -> bytes:
        turn = self._turn()
        answer = answer_of(chat)
        status = status_of(answer)
        response = response_object(turn, status=status, output=output_items(answer, status), answer=answer)
        await self._store(turn, response, answer)
        return orjson.dumps(response)

    def stream(self) -> StreamTranslator:
        turn = self._turn()
        return ResponsesStream(turn, lambda response, answer: self._store(turn, response, answer))

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return orjson.dumps({"error": error})

    def status(self, status: int) -> int:
        return status

    def _turn(self) -> Turn:
        if self._turn_read is None:
            raise RuntimeError("a Responses answer without its request")  # the bridge always reads the body first
        return self._turn_read

    async def _history(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        try:
            stored = await self._stores.current().get(tenant, response_id)
        except StoreUnavailable as exc:
            log.warning("stored responses unreachable: %s", exc)
            raise ApiError(
                503,
                "Stored responses are unreachable right now, so 'previous_response_id' cannot be followed; retry "
                "shortly, or send the whole conversation as 'input'.",
                param="previous_response_id",
                code="response_store_unavailable",
                headers={"retry-after": "1"},
            ) from None
        if stored is None:
            raise invalid_previous(response_id)
        return stored.messages

    async def _store(self, turn: Turn, response: dict[str, Any], answer: Answer) -> None:
        if not turn.request.store:
            return
        calls = [{"call_id": c["call_id"], "name": c["name"], "arguments": c["arguments"]} for c in answer.calls]
        messages = [*turn.history, *turn.request.messages, assistant_message(answer.text, calls)]
        stores = self._stores
        try:
            await stores.current().put(
                turn.tenant, StoredResponse(response, messages), ttl_s=stores.ttl_s, limit=stores.limit
            )
        except StoreUnavailable as exc:  # the answer still goes out; only chaining to it will fail
            log.warning("response %s not stored, the store is unreachable: %s", turn.id, exc)


def invalid_previous(response_id: str) -> ApiError:
    """OpenAI's answer for a ``previous_response_id`` this tenant has not stored (or that expired)."""
    error = invalid("previous_response_id", f"Previous response with id '{response_id}' not found.")
    error.status, error.code = 404, "previous_response_not_found"
    return error
