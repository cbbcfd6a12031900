"""A hosted frontier-model API stand-in: OpenAI's and Anthropic's wire formats, fixed latency profile.

The OpenAI routes live here; ``/v1/messages`` (Anthropic) in ``hosted_anthropic``; the model they share
(latency, output, prompt cache, injected faults) in ``hosted_model``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.responses import StreamingResponse

from spillgate.backends.sim.errors import validation_message
from spillgate.backends.sim.hosted_anthropic import add_anthropic_routes
from spillgate.backends.sim.hosted_faults import Fault
from spillgate.backends.sim.hosted_model import HostedConfig, SimHostedModel, finish_reason, key_accepted
from spillgate.backends.sim.protocol import ChatCompletionRequest, CompletionRequest
from spillgate.backends.sim.tokenizer import check_token_ids
from spillgate.backends.sim.wire import DONE, OrjsonResponse, sse_event

__all__ = ["HostedConfig", "create_hosted_app"]

SYSTEM_FINGERPRINT = "fp_spillgate_sim"
# A chunk cut off mid-JSON: what a broken proxy or a truncated write looks like.
MALFORMED_CHUNK = b'data: {"id": "chatcmpl-broken", "object": "chat.completion.chunk", "choices": [{"index": 0, "de\n\n'
MALFORMED_BODY = b'{"id": "chatcmpl-broken", "object": "chat.completion", "choices": [{"index": 0, "mess'


def _openai_error(
    message: str, err_type: str, code: str | None, status: int, headers: dict[str, str] | None = None
) -> OrjsonResponse:
    return OrjsonResponse(
        {"error": {"message": message, "type": err_type, "param": None, "code": code}},
        status_code=status,
        headers=headers,
    )


def _fault_response(fault: Fault, retry_after_s: int) -> OrjsonResponse | None:
    """The error OpenAI answers for an injected 429 or 500, or None for no error status."""
    if fault.status == 429:
        headers = {"retry-after": str(retry_after_s), "x-ratelimit-remaining-requests": "0"}
        message = "Rate limit reached for requests (simulated). Please try again later."
        return _openai_error(message, "requests", "rate_limit_exceeded", 429, headers)
    if fault.status is not None:
        message = "The server had an error while processing your request. Sorry about that!"
        return _openai_error(message, "server_error", None, fault.status)
    return None


class _Unauthorized(Exception):
    pass


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


async def _cut_stream(model: SimHostedModel, fault: Fault) -> AsyncIterator[bytes]:
    """The end of a stream an injected fault cut short: silence, or a broken chunk."""
    if fault.stall:
        await model.stall()
    else:
        yield MALFORMED_CHUNK


async def _cut_body(model: SimHostedModel, fault: Fault) -> Response:
    if fault.stall:
        await model.stall()
        return _openai_error("The server is shutting down.", "server_error", None, 503)
    return Response(MALFORMED_BODY, media_type="application/json")


def create_hosted_app(config: HostedConfig) -> FastAPI:
    """The simulator's app: OpenAI routes (bearer key) and Anthropic's ``/v1/messages`` (``x-api-key``)."""
    model = SimHostedModel(config)
    retry_after_s = config.faults.retry_after_s
    app = FastAPI(title="spillgate hosted-model simulator", docs_url=None, redoc_url=None)
    app.state.stop_generation = model.stop
    add_anthropic_routes(app, model)

    async def _require_api_key(request: Request) -> None:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key_accepted(key, config):
            raise _Unauthorized

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, exc: Exception) -> OrjsonResponse:
        return _openai_error(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            "invalid_request_error",
            "invalid_api_key",
            401,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: Exception) -> OrjsonResponse:
        assert isinstance(exc, RequestValidationError)
        return _openai_error(validation_message(exc), "invalid_request_error", None, 400)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=[Depends(_require_api_key)])
    async def models() -> dict[str, Any]:
        card = {"id": config.model_name, "object": "model", "created": 1700000000, "owned_by": "spillgate-sim"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", dependencies=[Depends(_require_api_key)])
    async def chat(body: ChatCompletionRequest) -> Response:
        fault = model.faults.next()
        failed = _fault_response(fault, retry_after_s)
        if failed is not None:
            return failed
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        prompt_ids = model.template.render(messages, body.tools)
        cached = model.cache.match_and_insert(prompt_ids)
        seed, plan = model.plan(prompt_ids, body.token_limit, body.seed)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": rid, "created": created, "model": config.model_name, "system_fingerprint": SYSTEM_FINGERPRINT}

        if not body.stream:
            ids = [token async for token in model.tokens(seed, plan, fault.cut_after)]
            if fault.cut_after is not None:
                return await _cut_body(model, fault)
            message = {"role": "assistant", "content": model.tokenizer.decode(ids), "refusal": None, "annotations": []}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(plan)}
            return OrjsonResponse(
                {
                    **head,
                    "object": "chat.completion",
                    "choices": [choice],
                    "usage": _usage(len(prompt_ids), len(ids), cached),
                    "service_tier": "default",
                }
            )

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            payload: dict[str, Any] = {
                **head,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if body.include_usage:
                payload["usage"] = None
            return sse_event(payload)

        async def events() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": "", "refusal": None}, None)
            count = 0
            async for token in model.tokens(seed, plan, fault.cut_after):
                count += 1
                text = model.tokenizer.decode([token])
                if text:
                    yield chunk({"content": text}, None)
            if fault.cut_after is not None:
                async for tail in _cut_stream(model, fault):
                    yield tail
                return
            yield chunk({}, finish_reason(plan))
            if body.include_usage:
                usage = _usage(len(prompt_ids), count, cached)
                yield sse_event({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            yield DONE

        return _stream(events())

    @app.post("/v1/completions", dependencies=[Depends(_require_api_key)])
    async def completions(body: CompletionRequest) -> Response:
        try:
            prompt = body.single_prompt()
            prompt_ids = model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            check_token_ids(prompt_ids)
        except ValueError as exc:
            return _openai_error(str(exc), "invalid_request_error", None, 400)
        fault = model.faults.next()
        failed = _fault_response(fault, retry_after_s)
        if failed is not None:
            return failed
        cached = model.cache.match_and_insert(prompt_ids)
        seed, plan = model.plan(prompt_ids, body.max_tokens, body.seed)
        rid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": config.model_name}

        if not body.stream:
            ids = [token async for token in model.tokens(seed, plan, fault.cut_after)]
            if fault.cut_after is not None:
                return await _cut_body(model, fault)
            text = model.tokenizer.decode(ids)
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(plan)}
            return OrjsonResponse({**head, "choices": [choice], "usage": _usage(len(prompt_ids), len(ids), cached)})

        async def events() -> AsyncIterator[bytes]:
            count = 0
            async for token in model.tokens(seed, plan, fault.cut_after):
                count += 1
                finish = finish_reason(plan) if count == plan.length else None
                text = model.tokenizer.decode([token])
                yield sse_event(
                    {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
                )
            if fault.cut_after is not None:
                async for tail in _cut_stream(model, fault):
                    yield tail
                return
            if body.include_usage:
                yield sse_event({**head, "choices": [], "usage": _usage(len(prompt_ids), count, cached)})
            yield DONE

        return _stream(events())

    return app


def _stream(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(events, media_type="text/event-stream")
