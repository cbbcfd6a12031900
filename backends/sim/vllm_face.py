"""The simulator's vLLM face: vLLM 0.32's OpenAI server over the same scheduler, cache and timing model.

``spillgate sim-replica --engine vllm`` serves what ``vllm serve`` does (``entrypoints/openai``, ``serve/``):
``/health`` at once, ``/version``, ``/v1/models`` with ``max_model_len`` and permissions, an always-on
``/metrics`` under vLLM's names, ``/kv_event_sources``; no ``/ready`` and no ``/server_info`` (404). Bodies and
stream chunks carry vLLM's fields; ``usage.prompt_tokens_details`` only with ``--enable-prompt-tokens-details``,
``cached_tokens`` in whole KV blocks. Errors are OpenAI's nested shape with vLLM's messages. Compared field by
field with the captured fixtures in ``tests/fixtures/vllm``.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from spillgate.backends.sim.engine import GenerationParams, RequestHandle
from spillgate.backends.sim.protocol import ChatCompletionRequest, CompletionRequest
from spillgate.backends.sim.replica import Replica, ReplicaDep
from spillgate.backends.sim.request import SimRequest
from spillgate.backends.sim.tokenizer import BEGIN_OF_TEXT
from spillgate.backends.sim.wire import DONE, EventStreamResponse, OrjsonResponse, sse_event

VLLM_VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VLLM_VERSION}-sim"
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
"""What ``--api-key`` protects (``serve/middleware/authenticate.py``); probes and scrapes stay open."""

router = APIRouter()


class VllmError(ValueError):
    """A request vLLM refuses: its message (naming the parameter and value, as ``VLLMValidationError`` does)."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        value: object = None,
        *,
        status: int = 400,
        kind: str = "BadRequestError",
    ) -> None:
        super().__init__(message + (f" (parameter={param}, value={value})" if param else ""))
        self.param, self.status, self.kind = param, status, kind

    def response(self) -> OrjsonResponse:
        body = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}
        return OrjsonResponse(body, status_code=self.status)


@router.get("/health")
@router.get("/ping")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/version")
async def version() -> OrjsonResponse:
    return OrjsonResponse({"version": VLLM_VERSION})


@router.get("/kv_event_sources")
async def kv_event_sources(replica: ReplicaDep) -> OrjsonResponse:
    """``--kv-events-config`` as vLLM holds it, per data-parallel rank; ``{}`` without it."""
    config = replica.config.kv_events
    return OrjsonResponse(config.sources() if config is not None else {})


dev_router = APIRouter()
"""Served only with ``VLLM_SERVER_DEV_MODE=1``, as vLLM's development endpoints are."""


@dev_router.post("/reset_prefix_cache")
async def reset_prefix_cache(replica: ReplicaDep) -> Response:
    """Empty the prefix cache (and publish ``AllBlocksCleared``) when no request holds blocks; 200 either way."""
    await replica.scheduler.flush_cache()
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(replica: ReplicaDep) -> Response:
    return Response(content=replica.metrics.render(), media_type="text/plain; version=1.0.0; charset=utf-8")


def _model_card(replica: Replica, model_id: str) -> dict[str, Any]:
    created = int(replica.started_unix)
    permission = {
        "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_DNS, model_id).hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": replica.config.model_path,
        "parent": None,
        "max_model_len": replica.config.context_length,
        "permission": [permission],
    }


@router.get("/v1/models")
async def list_models(replica: ReplicaDep) -> OrjsonResponse:
    return OrjsonResponse({"object": "list", "data": [_model_card(replica, replica.config.served_model_name)]})


def _check(replica: Replica, payload: dict[str, Any], prompt_tokens: int, limit: int | None) -> int | None:
    """vLLM's checks (``renderers/params.py``, ``sampling_params.py``); the output limit, clamped to the context."""
    context = replica.config.context_length
    if payload.get("model") not in (None, replica.config.served_model_name):
        missing = VllmError(
            f"The model `{payload['model']}` does not exist. Valid aliases: {replica.config.served_model_name}.",
            status=404,
            kind="NotFoundError",
        )
        missing.param = "model"
        raise missing
    temperature = payload.get("temperature")
    if isinstance(temperature, int | float) and (temperature < 0 or not math.isfinite(temperature)):
        value = float(temperature)
        raise VllmError(f"temperature must be non-negative, got {value}.", "temperature", value)
    if limit is not None and limit < 1:
        raise VllmError(f"max_tokens must be at least 1, got {limit}.", "max_tokens", limit)
    if limit is not None and limit > context:
        raise VllmError(
            f"max_tokens={limit} cannot be greater than max_model_len={context}. Please request fewer output tokens.",
            "max_tokens",
            limit,
        )
    if prompt_tokens >= context:
        # vLLM counts the prompt only up to the first token past the limit: "at least" that many.
        raise VllmError(
            f"This model's maximum context length is {context} tokens. However, your prompt contains at least "
            f"{context + 1} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt.",
            "input_tokens",
            context + 1,
        )
    room = context - prompt_tokens
    return room if limit is None else min(limit, room)  # vLLM lowers max_tokens to fit, it does not refuse


async def _body(request: Request) -> dict[str, Any]:
    try:
        payload = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise VllmError("Invalid JSON body.") from None
    if not isinstance(payload, dict):
        raise VllmError("The request body must be a JSON object.")
    return payload


def _submit(replica: Replica, input_ids: list[int], body: Any, limit: int | None) -> RequestHandle:
    params = GenerationParams(
        max_new_tokens=limit,
        exact_length=body.ignore_eos or limit is not None,
        seed=body.seed,
        cache_salt=body.cache_salt,
        stream=body.stream,
    )
    return replica.engine.submit(input_ids, params)


def _usage(replica: Replica, req: SimRequest, *, chat: bool, stream: bool) -> dict[str, Any]:
    prompt, completion = len(req.input_ids), len(req.output_ids)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    details = None
    if replica.config.enable_cache_report:
        block = replica.config.page_size
        cached = req.cached_tokens // block * block
        created = (prompt - cached) // block * block if chat else None
        details = {"cached_tokens": cached, "created_cache_tokens": created, "multimodal_tokens": None}
        if stream:  # written with exclude_none
            details = {key: value for key, value in details.items() if value is not None}
    if stream:
        return {**usage, **({"prompt_tokens_details": details} if details else {})}
    return {**usage, "prompt_tokens_details": details, "completion_tokens_details": None}


def _finish(req: SimRequest) -> str | None:
    return req.finish_reason["type"] if req.finish_reason else None


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, replica: ReplicaDep) -> Response:
    try:
        payload = await _body(request)
        body = ChatCompletionRequest.model_validate(payload)
        input_ids = replica.chat_template.render(
            [message.model_dump(exclude_none=True) for message in body.messages], body.tools
        )
        limit = _check(replica, payload, len(input_ids), body.token_limit)
        handle = _submit(replica, input_ids, body, limit)
    except VllmError as refused:
        return refused.response()
    except (ValidationError, ValueError) as exc:
        return VllmError(str(exc).splitlines()[0]).response()
    rid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
    if body.stream:
        return EventStreamResponse(_chat_stream(replica, handle, body, rid, created), on_close=handle.close)
    req = await handle.result(request.is_disconnected)
    message = {
        "role": "assistant",
        "content": replica.tokenizer.decode(req.output_ids),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": _finish(req),
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    return OrjsonResponse(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": _usage(replica, req, chat=True, stream=False),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


async def _chat_stream(
    replica: Replica, handle: RequestHandle, body: ChatCompletionRequest, rid: str, created: int
) -> AsyncIterator[bytes]:
    """vLLM sends the role chunk first and puts ``finish_reason`` on the last content chunk."""
    req, model = handle.req, body.model
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    yield sse_event({**head, "choices": [first], "prompt_token_ids": None, "prompt_text": None})
    async for update in handle.updates():
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": replica.tokenizer.decode(update.new_ids)},
            "logprobs": None,
            "finish_reason": _finish(req) if update.finished else None,
            "token_ids": None,
        }
        chunk = {**head, "choices": [choice]}
        if update.finished:
            choice["stop_reason"] = None
            if not body.include_usage:  # else the usage chunk carries it
                chunk["system_fingerprint"] = FINGERPRINT
        yield sse_event(chunk)
    if body.include_usage:
        usage = _usage(replica, req, chat=True, stream=True)
        yield sse_event({**head, "choices": [], "system_fingerprint": FINGERPRINT, "usage": usage})
    yield DONE


@router.post("/v1/completions")
async def completions(request: Request, replica: ReplicaDep) -> Response:
    payload: dict[str, Any] = {}
    try:
        payload = await _body(request)
        if isinstance(payload.get("max_tokens"), int) and payload["max_tokens"] < 1:
            limit = payload["max_tokens"]
            raise VllmError(f"max_tokens must be at least 1, got {limit}.", "max_tokens", limit)
        body = CompletionRequest.model_validate(payload)
        prompt = body.single_prompt()
        input_ids = [BEGIN_OF_TEXT, *replica.tokenizer.encode(prompt)] if isinstance(prompt, str) else list(prompt)
        limit = _check(replica, payload, len(input_ids), body.max_tokens)
        handle = _submit(replica, input_ids, body, limit)
    except VllmError as refused:
        return refused.response()
    except (ValidationError, ValueError) as exc:
        return VllmError(str(exc).splitlines()[0]).response()
    rid, created = f"cmpl-{uuid.uuid4().hex[:16]}", int(time.time())
    head = {"id": rid, "object": "text_completion", "created": created, "model": body.model}
    if body.stream:
        return EventStreamResponse(_completion_stream(replica, handle, body, head), on_close=handle.close)
    req = await handle.result(request.is_disconnected)
    choice = {
        "index": 0,
        "text": replica.tokenizer.decode(req.output_ids),
        "logprobs": None,
        "finish_reason": _finish(req),
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }
    return OrjsonResponse(
        {
            **head,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": _usage(replica, req, chat=False, stream=False),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


async def _completion_stream(
    replica: Replica, handle: RequestHandle, body: CompletionRequest, head: dict[str, Any]
) -> AsyncIterator[bytes]:
    req = handle.req
    async for update in handle.updates():
        choice = {
            "index": 0,
            "text": replica.tokenizer.decode(update.new_ids),
            "logprobs": None,
            "finish_reason": _finish(req) if update.finished else None,
            "stop_reason": None,
            "token_ids": None,
            "prompt_token_ids": None,
        }
        yield sse_event({**head, "choices": [choice]})
    if body.include_usage:
        usage = _usage(replica, req, chat=False, stream=True)
        yield sse_event({**head, "choices": [], "system_fingerprint": FINGERPRINT, "usage": usage})
    yield DONE
