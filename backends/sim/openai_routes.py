"""SGLang's OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from spillgate.backends.sim import payloads
from spillgate.backends.sim.engine import GenerationParams, RequestHandle
from spillgate.backends.sim.errors import error_response
from spillgate.backends.sim.protocol import ChatCompletionRequest, CompletionRequest
from spillgate.backends.sim.replica import Replica, ReplicaDep
from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT
from spillgate.backends.sim.wire import DONE, EventStreamResponse, OrjsonResponse, sse_event

router = APIRouter()


async def require_json(request: Request) -> None:
    """SGLang rejects a body that is not declared as application/json (as a 400)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise RequestValidationError(
            [
                {
                    "loc": ["header", "content-type"],
                    "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                    "type": "value_error",
                }
            ]
        )


def _model_card(replica: Replica, model_id: str) -> dict[str, object]:
    return {
        "id": model_id,
        "object": "model",
        "created": int(replica.started_unix),
        "owned_by": "sglang",
        "root": model_id,
        "parent": None,
        "max_model_len": replica.config.context_length,
    }


@router.get("/v1/models")
async def list_models(replica: ReplicaDep) -> OrjsonResponse:
    return OrjsonResponse({"object": "list", "data": [_model_card(replica, replica.config.served_model_name)]})


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, replica: ReplicaDep) -> OrjsonResponse:
    if model != replica.config.served_model_name:
        return OrjsonResponse(
            {
                "error": {
                    "message": f"The model '{model}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            status_code=404,
        )
    return OrjsonResponse(_model_card(replica, model))


def _submit(
    replica: Replica, input_ids: list[int], body: ChatCompletionRequest | CompletionRequest, limit: int | None
) -> RequestHandle:
    """A client limit (or ignore_eos) makes the reply exactly that long, as max_tokens does on GPU."""
    check_sampling(body)
    params = GenerationParams(
        max_new_tokens=limit,
        exact_length=limit is not None or body.ignore_eos,
        seed=body.seed,
        rid=body.rid,
        cache_salt=body.cache_salt,
        extra_key=body.extra_key,
        priority=body.priority,
        stream=body.stream,
    )
    return replica.engine.submit(input_ids, params)


def check_sampling(body: ChatCompletionRequest | CompletionRequest) -> None:
    """SGLang's ``SamplingParams.verify`` checks, with its messages (``sampling/sampling_params.py``)."""
    temperature = getattr(body, "temperature", None)
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0.0):
        raise ValueError(f"temperature must be a non-negative finite number, got {float(temperature)}.")
    top_p = getattr(body, "top_p", None)
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {float(top_p)}.")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(body, name, None)
        if value is not None and not -2.0 <= value <= 2.0:
            raise ValueError(f"{name} must be in [-2, 2], got {float(value)}.")


@router.post("/v1/chat/completions", dependencies=[Depends(require_json)])
async def chat_completions(body: ChatCompletionRequest, request: Request, replica: ReplicaDep) -> Response:
    if body.n != 1:
        return error_response("The simulator supports n=1 only.")
    input_ids = body.input_ids or replica.chat_template.render(
        [message.model_dump(exclude_none=True) for message in body.messages], body.tools
    )
    try:
        handle = _submit(replica, input_ids, body, body.token_limit)
    except ValueError as exc:
        return error_response(str(exc))
    created = int(time.time())
    if body.stream:
        return EventStreamResponse(_chat_stream(replica, handle, body, created), on_close=handle.close)
    req = await handle.result(request.is_disconnected)
    text = replica.tokenizer.decode(req.output_ids)
    cache_report = replica.config.enable_cache_report
    return OrjsonResponse(payloads.chat_completion(req, text, body.model, created, cache_report))


async def _chat_stream(
    replica: Replica, handle: RequestHandle, body: ChatCompletionRequest, created: int
) -> AsyncIterator[bytes]:
    req, model, cache_report = handle.req, body.model, replica.config.enable_cache_report
    # SGLang sends the role chunk together with the first token, not before prefill: TTFT seen by a client
    # (or a gateway) starts at the first event.
    role = sse_event(payloads.chat_chunk(req, model, created, role="assistant", content=""))
    emitted = 0
    async for update in handle.updates():
        if role:
            yield role
            role = b""
        emitted += len(update.new_ids)
        text = replica.tokenizer.decode(update.new_ids)
        if text:
            chunk_usage = None
            if body.continuous_usage_stats:
                chunk_usage = payloads.usage(req, cache_report=cache_report, completion_tokens=emitted)
            yield sse_event(payloads.chat_chunk(req, model, created, content=text, chunk_usage=chunk_usage))
    if role:
        yield role
    yield sse_event(
        payloads.chat_chunk(
            req, model, created, finish_reason=payloads.finish_type(req), matched=payloads.matched_stop(req)
        )
    )
    if body.include_usage:
        yield sse_event(payloads.usage_chunk(req, "chat.completion.chunk", model, created, cache_report))
    yield DONE


def _completion_prompt(replica: Replica, body: CompletionRequest) -> list[int]:
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        return [BEGIN_OF_TEXT, *replica.tokenizer.encode(prompt)]
    return list(prompt)


@router.post("/v1/completions", dependencies=[Depends(require_json)])
async def completions(body: CompletionRequest, request: Request, replica: ReplicaDep) -> Response:
    if body.n != 1:
        return error_response("The simulator supports n=1 only.")
    try:
        input_ids = _completion_prompt(replica, body)
        handle = _submit(replica, input_ids, body, body.max_tokens)
    except ValueError as exc:
        return error_response(str(exc))
    created = int(time.time())
    echo = replica.tokenizer.decode(input_ids) if body.echo else ""
    if body.stream:
        return EventStreamResponse(_completion_stream(replica, handle, body, created, echo), on_close=handle.close)
    req = await handle.result(request.is_disconnected)
    text = echo + replica.tokenizer.decode(req.output_ids)
    cache_report = replica.config.enable_cache_report
    return OrjsonResponse(payloads.completion(req, text, body.model, created, cache_report))


async def _completion_stream(
    replica: Replica, handle: RequestHandle, body: CompletionRequest, created: int, echo: str
) -> AsyncIterator[bytes]:
    req, model, cache_report = handle.req, body.model, replica.config.enable_cache_report
    emitted = 0
    async for update in handle.updates():
        emitted += len(update.new_ids)
        text = echo + replica.tokenizer.decode(update.new_ids)
        echo = ""
        chunk_usage = None
        if body.continuous_usage_stats:
            chunk_usage = payloads.usage(req, cache_report=cache_report, completion_tokens=emitted)
        yield sse_event(
            payloads.completion_chunk(req, text, model, created, finished=update.finished, chunk_usage=chunk_usage)
        )
    if body.include_usage:
        yield sse_event(payloads.usage_chunk(req, "text_completion", model, created, cache_report))
    yield DONE
