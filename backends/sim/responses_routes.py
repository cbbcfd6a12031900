"""``POST /v1/responses``, ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel`` on both faces.

Both engines serve OpenAI's Responses API by rendering the input as a chat conversation and generating a reply
(``responses_input.py``), answered whole or as typed events (``responses_stream.py``) in each engine's shapes
(``responses_payloads.py``). What differs, as captured in ``tests/fixtures/<engine>/responses/``:

- the output limit: SGLang generates ``max_output_tokens - 2`` tokens (headroom it keeps for BOS/EOS,
  ``ResponsesRequest.to_sampling_params``); vLLM the limit, lowered to the context left;
- the store (``responses_store.py``): SGLang refuses ``previous_response_id``, retrieval and cancelling with 400
  unless started with ``--enable-response-store``; vLLM ignores ``store`` unless ``VLLM_ENABLE_RESPONSES_API_STORE``
  is set, so an unknown id is a 404 either way;
- cancelling a finished response: SGLang returns it as it is, vLLM refuses (400);
- the checks and their order, and the error messages (both in OpenAI's nested error shape).

Background responses are not simulated (refused with 400).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from spillgate.backends.sim.choices import Choice, close_all, results
from spillgate.backends.sim.engine import GenerationParams
from spillgate.backends.sim.openai_routes import check_sampling
from spillgate.backends.sim.replica import Replica, ReplicaDep
from spillgate.backends.sim.request import SimRequest
from spillgate.backends.sim.responses_input import (
    Message,
    ResponsesBody,
    chat_tools,
    conversation,
    input_messages,
)
from spillgate.backends.sim.responses_payloads import (
    Counts,
    Engine,
    ResponseHead,
    Status,
    error_body,
    new_id,
    output_items,
    response,
)
from spillgate.backends.sim.responses_store import ResponseStore, StoredResponse
from spillgate.backends.sim.responses_stream import events
from spillgate.backends.sim.wire import EventStreamResponse, OrjsonResponse

SGLANG_MAX_TOKENS_HEADROOM = 2
"""SGLang takes this off ``max_output_tokens`` for the BOS/EOS tokens it adds."""
SGLANG_STORE_DISABLED = (
    "Response store is disabled. Stateful Responses require --enable-response-store on a standalone server; "
    "response storage is unavailable in PD mode."
)

sglang_router = APIRouter()
vllm_router = APIRouter()


class Refusal(Exception):
    """A request the engine refuses, with the status, message, type and parameter it names."""

    def __init__(
        self, message: str, *, status: int = 400, err_type: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.err_type, self.param = status, err_type, param

    def response(self) -> OrjsonResponse:
        body = error_body(str(self), err_type=self.err_type, code=self.status, param=self.param)
        return OrjsonResponse(body, status_code=self.status)


@dataclass(frozen=True)
class Accepted:
    """A request past every check: its fields, what the response will say, the scheduled reply, and the
    conversation a follow-up would continue (without the reply)."""

    engine: Engine
    body: ResponsesBody
    head: ResponseHead
    choice: Choice
    turns: tuple[Message, ...]
    persist: bool


def response_store(request: Request) -> ResponseStore:
    return request.app.state.response_store


async def _parse(request: Request, engine: Engine) -> ResponsesBody:
    """The body, refused as each engine's validation refuses it: not JSON (or not declared as JSON), or not a
    Responses request. SGLang reports no parameter; vLLM the field's path (``body.input``)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        unsupported = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
        raise Refusal(unsupported, err_type="Bad Request")
    try:
        payload = orjson.loads(await request.body())
        return ResponsesBody.model_validate(payload)
    except orjson.JSONDecodeError as exc:
        raise Refusal(f"1 validation error:\n  JSON decode error: {exc}", err_type="Bad Request") from None
    except ValidationError as exc:
        errors = exc.errors()
        message = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}:\n" + "\n".join(
            f"  {{'type': {e['type']!r}, 'loc': {'.'.join(map(str, ('body', *e['loc'])))!r}, 'msg': {e['msg']!r}}}"
            for e in errors
        )
        param = ".".join(map(str, ("body", *errors[0]["loc"]))) if engine == "vllm" and errors else None
        raise Refusal(message, err_type="Bad Request", param=param) from None


def _sglang_checks(body: ResponsesBody, replica: Replica, store: ResponseStore) -> StoredResponse | None:
    """``OpenAIServingResponses.create_responses``' refusals, in its order; the stored response continued."""
    if not store.enabled and body.previous_response_id is not None:
        raise Refusal(SGLANG_STORE_DISABLED, param="previous_response_id")
    if not store.enabled and body.background:
        raise Refusal(SGLANG_STORE_DISABLED, param="background")
    if body.background and not body.store:
        raise Refusal("background=true requires store=true.", param="store")
    if body.model is not None and body.model != replica.config.served_model_name:
        raise Refusal(f"The model '{body.model}' does not exist", status=404, param="model")
    if body.tool_choice == "required" and not any(t.get("type") in ("function", "custom") for t in body.tools):
        raise Refusal(
            'tool_choice="required" requires at least one tool with type="function" or type="custom"; other '
            "built-in tool types cannot be forced."
        )
    if isinstance(body.tool_choice, dict) and body.tool_choice.get("type") in ("function", "custom"):
        name = body.tool_choice.get("name")
        if not any(t.get("type") in ("function", "custom") and t.get("name") == name for t in body.tools):
            raise Refusal(f"Tool {name!r} is not declared in tools", param="tool_choice")
    if body.stream and body.wants_logprobs:
        raise Refusal("logprobs are not supported in streaming mode", param="logprobs")
    previous = None
    if body.previous_response_id is not None:
        if not body.previous_response_id.startswith("resp_"):
            raise _sglang_invalid_id(body.previous_response_id)
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise _not_found(body.previous_response_id)
    if body.background:
        raise Refusal("Background responses are not simulated.", param="background")
    return previous


def _vllm_checks(body: ResponsesBody, replica: Replica, store: ResponseStore) -> StoredResponse | None:
    """vLLM's request validators and ``_create_responses``' refusals, in their order."""
    if body.background and body.store is False:
        raise Refusal(
            "1 validation error:\n  Value error, background can only be used when `store` is true",
            err_type="Bad Request",
            param="background",
        )
    if not body.tools and body.tool_choice == "required":
        raise Refusal(
            "1 validation error:\n  Value error, Tool choice 'required' must be specified with 'tools' parameter.",
            err_type="Bad Request",
            param="tool_choice",
        )
    if body.model is not None and body.model != replica.config.served_model_name:
        raise Refusal(
            f"The model `{body.model}` does not exist. Valid aliases: {replica.config.served_model_name}.",
            status=404,
            err_type="NotFoundError",
            param="model",
        )
    if body.store and not store.enabled and body.background:
        raise Refusal(
            "This vLLM engine does not support `store=True` and therefore does not support the background mode. To "
            "enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
            "launching the vLLM server.",
            param="background",
        )
    previous = None
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise _not_found(body.previous_response_id)
    if body.background:
        raise Refusal("Background responses are not simulated.", param="background")
    return previous


def _sglang_invalid_id(response_id: str) -> Refusal:
    return Refusal(
        f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.", param="response_id"
    )


def _not_found(response_id: str) -> Refusal:
    return Refusal(f"Response with id '{response_id}' not found.", status=404, param="response_id")


def _limit(engine: Engine, body: ResponsesBody, replica: Replica, prompt_tokens: int) -> int | None:
    """The output limit the engine gives the request (None: what the context leaves, SGLang's default)."""
    if engine == "sglang":
        try:
            check_sampling(body)  # type: ignore[arg-type]
        except ValueError as exc:
            raise Refusal(str(exc)) from None
        if body.max_output_tokens is None:
            return None
        limit = body.max_output_tokens - SGLANG_MAX_TOKENS_HEADROOM
        if limit < 0:
            raise Refusal(f"max_new_tokens must be at least 0, got {limit}.")
        return limit
    context = replica.config.context_length
    if prompt_tokens >= context:
        raise Refusal(
            f"The engine prompt length {prompt_tokens} exceeds the max_model_len {context}. Please reduce prompt.",
            param="input",
        )
    if body.temperature is not None and body.temperature < 0:
        raise Refusal(
            f"temperature must be non-negative, got {float(body.temperature)}.",
            err_type="BadRequestError",
            param="temperature",
        )
    room = context - prompt_tokens
    limit = room if body.max_output_tokens is None else min(body.max_output_tokens, room)
    if limit < 1:
        raise Refusal(f"max_tokens must be at least 1, got {limit}.", err_type="BadRequestError", param="max_tokens")
    return limit


def _accept(engine: Engine, body: ResponsesBody, replica: Replica, store: ResponseStore) -> Accepted:
    previous = (_sglang_checks if engine == "sglang" else _vllm_checks)(body, replica, store)
    history = previous.turns if previous is not None else ()
    new = input_messages(body.input)
    turns = tuple([*history, *(message for message in new if message.get("role") not in ("system", "developer"))])
    input_ids = replica.chat_template.render(conversation(body.instructions, history, new), chat_tools(body.tools))
    limit = _limit(engine, body, replica, len(input_ids))
    response_id = body.request_id or new_id("resp", engine)
    params = GenerationParams(
        max_new_tokens=limit,
        exact_length=body.max_output_tokens is not None or body.ignore_eos,
        seed=body.seed if engine == "vllm" else None,
        rid=response_id if engine == "sglang" else None,
        cache_salt=body.cache_salt,
        extra_key=body.extra_key if engine == "sglang" else None,
        priority=body.priority,
        stream=bool(body.stream),
        stop=body.stop_strings,
    )
    try:
        choice = Choice(0, replica.engine.submit(input_ids, params))
    except ValueError as exc:
        raise Refusal(str(exc)) from None
    model = replica.config.served_model_name if engine == "vllm" else body.model or replica.config.served_model_name
    shown_limit = body.max_output_tokens if engine == "sglang" else limit
    head = ResponseHead(response_id, int(time.time()), model, shown_limit)
    return Accepted(engine, body, head, choice, turns, persist=store.enabled and bool(body.store))


def _status(engine: Engine, req: SimRequest) -> Status:
    """``length`` is incomplete on both; an aborted reply failed on SGLang, and counts as completed on vLLM."""
    kind = req.finish_reason.get("type") if req.finish_reason else None
    if kind == "length":
        return "incomplete"
    if kind == "abort" and engine == "sglang":
        return "failed"
    return "completed"


def _finish(
    accepted: Accepted, replica: Replica, store: ResponseStore, text: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    """The whole response, kept (with the conversation it ends) when the request asked for that and the engine
    keeps responses."""
    engine, req = accepted.engine, accepted.choice.req
    status = _status(engine, req)
    cached = req.cached_tokens
    if engine == "vllm":  # whole KV blocks
        cached = cached // replica.config.page_size * replica.config.page_size
    counts = Counts(len(req.input_ids), len(req.output_ids), cached)
    error = {"code": "server_error", "message": "Generation aborted"} if status == "failed" else None
    body = response(
        accepted.body, accepted.head, engine=engine, output=output, status=status, counts=counts, error=error
    )
    if accepted.persist:
        reply: tuple[Message, ...] = ({"role": "assistant", "content": text},) if text else ()
        store.put(accepted.head.response_id, StoredResponse(body, accepted.turns + reply))
    return body


async def _create(request: Request, replica: Replica, engine: Engine) -> Response:
    store = response_store(request)
    try:
        body = await _parse(request, engine)
        accepted = _accept(engine, body, replica, store)
    except Refusal as refused:
        return refused.response()
    item_id = new_id("msg", engine)
    choice = accepted.choice
    if body.stream:
        opening = response(body, accepted.head, engine=engine, output=[], status="in_progress", counts=None)
        stream = events(
            choice,
            engine=engine,
            item_id=item_id,
            opening=opening,
            finish=lambda text, output: _finish(accepted, replica, store, text, output),
        )
        return EventStreamResponse(stream, on_close=close_all([choice]))
    await results([choice], request.is_disconnected)
    text = choice.text()
    return OrjsonResponse(_finish(accepted, replica, store, text, output_items(item_id, text, engine=engine)))


@sglang_router.post("/v1/responses")
async def sglang_create(request: Request, replica: ReplicaDep) -> Response:
    return await _create(request, replica, "sglang")


@vllm_router.post("/v1/responses")
async def vllm_create(request: Request, replica: ReplicaDep) -> Response:
    return await _create(request, replica, "vllm")


def _sglang_stored(request: Request, response_id: str) -> StoredResponse:
    store = response_store(request)
    if not store.enabled:
        raise Refusal(SGLANG_STORE_DISABLED, param="response_id")
    if not response_id.startswith("resp_"):
        raise _sglang_invalid_id(response_id)
    stored = store.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


@sglang_router.get("/v1/responses/{response_id}")
@sglang_router.post("/v1/responses/{response_id}/cancel")
async def sglang_retrieve(response_id: str, request: Request) -> OrjsonResponse:
    """Retrieve, and cancel too: every stored response has finished (no background mode), and SGLang answers a
    cancel of a finished one with the response as it is."""
    try:
        return OrjsonResponse(_sglang_stored(request, response_id).body)
    except Refusal as refused:
        return refused.response()


@vllm_router.get("/v1/responses/{response_id}")
async def vllm_retrieve(response_id: str, request: Request) -> OrjsonResponse:
    stored = response_store(request).get(response_id)
    if stored is None:
        return _not_found(response_id).response()
    return OrjsonResponse(stored.body)


@vllm_router.post("/v1/responses/{response_id}/cancel")
async def vllm_cancel(response_id: str, request: Request) -> OrjsonResponse:
    """vLLM cancels only background responses still running; any other stored one is refused."""
    if response_store(request).get(response_id) is None:
        return _not_found(response_id).response()
    return Refusal("Cannot cancel a synchronous response.", param="response_id").response()
