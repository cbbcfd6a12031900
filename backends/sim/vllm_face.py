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

from spillgate.backends.sim import logprobs, vllm_payloads
from spillgate.backends.sim.choices import Choice, close_all, merged, results, token_texts
from spillgate.backends.sim.client_features import (
    ChoicePlan,
    forced_tools,
    plan_choice,
    vllm_parser_problem,
    vllm_problem,
)
from spillgate.backends.sim.engine import GenerationParams
from spillgate.backends.sim.generation import request_seed
from spillgate.backends.sim.logprobs import MAX_TOP_LOGPROBS
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


def _choices(
    replica: Replica, input_ids: list[int], body: Any, limit: int | None, plans: list[ChoicePlan] | None = None
) -> list[Choice]:
    """One scheduled request per choice (vLLM forks the sequence ``n`` times)."""
    n = body.n
    choices = []
    for index in range(n):
        plan = plans[index] if plans else ChoicePlan()
        params = GenerationParams(
            max_new_tokens=limit,
            exact_length=body.ignore_eos or limit is not None,
            seed=body.seed,
            cache_salt=body.cache_salt,
            stream=body.stream,
            choice=index,
            stop=body.stop_strings,
            script=plan.script,
        )
        choices.append(Choice(index, replica.engine.submit(input_ids, params), plan))
    return choices


def _usage(replica: Replica, reqs: list[SimRequest], *, chat: bool, stream: bool) -> dict[str, Any]:
    """Over ``n`` choices: the prompt once, every choice's completion."""
    req = reqs[0]
    prompt, completion = len(req.input_ids), sum(len(r.output_ids) for r in reqs)
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


def _plans(replica: Replica, input_ids: list[int], body: ChatCompletionRequest) -> list[ChoicePlan] | None:
    tools = forced_tools(body.tools, body.tool_choice)
    if tools is None and not body.response_format:
        return None
    named = isinstance(body.tool_choice, dict)
    seeds = [request_seed(input_ids, replica.config.seed, body.seed, index) for index in range(body.n)]
    return [plan_choice(seed, tools, named, body.response_format, arguments_only=True) for seed in seeds]


def _top_k(requested: int | None, enabled: bool) -> int | None:
    """How many alternatives to list per token (-1: vLLM's "all", shown as the most it allows); None: no logprobs."""
    if not enabled:
        return None
    requested = requested or 0
    return MAX_TOP_LOGPROBS if requested < 0 else min(requested, MAX_TOP_LOGPROBS)


def _chat_answer(choice: Choice, body: ChatCompletionRequest) -> dict[str, Any]:
    """A forced call becomes ``tool_calls`` with empty content; "required" ends with "tool_calls", a named tool
    with "stop" (``serving.py``: OpenAI's convention)."""
    req, text = choice.req, choice.text()
    finish_reason = vllm_payloads.finish(req)
    calls = None
    if choice.called() and choice.plan.call is not None:
        calls = [vllm_payloads.tool_call(choice.plan.call.name, choice.plan.call.arguments)]
        text = ""
        if body.tool_choice == "required":
            finish_reason = "tool_calls"
    k = _top_k(body.top_logprobs, body.logprobs)
    scores = None
    if k is not None:
        tokens = token_texts(req, 0, len(req.output_ids))
        scores = vllm_payloads.chat_logprobs(choice.logprobs(tokens, 0, k))
    return vllm_payloads.chat_choice(choice.index, req, vllm_payloads.message(text, calls), scores, finish_reason)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, replica: ReplicaDep) -> Response:
    try:
        payload = await _body(request)
        problem = vllm_problem(payload)
        if problem:
            raise VllmError(problem[0], problem[1])
        config = replica.config
        unparsable = vllm_parser_problem(payload, config.tool_call_parser, config.enable_auto_tool_choice)
        if unparsable:
            raise VllmError(unparsable)
        body = ChatCompletionRequest.model_validate(payload)
        input_ids = replica.chat_template.render(
            [message.model_dump(exclude_none=True) for message in body.messages], body.tools
        )
        limit = _check(replica, payload, len(input_ids), body.token_limit)
        choices = _choices(replica, input_ids, body, limit, _plans(replica, input_ids, body))
    except VllmError as refused:
        return refused.response()
    except (ValidationError, ValueError) as exc:
        return VllmError(str(exc).splitlines()[0]).response()
    rid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
    if body.stream:
        return EventStreamResponse(_chat_stream(replica, choices, body, rid, created), on_close=close_all(choices))
    reqs = await results(choices, request.is_disconnected)
    return OrjsonResponse(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": [_chat_answer(choice, body) for choice in choices],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": _usage(replica, reqs, chat=True, stream=False),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def _tool_delta(choice: Choice, finished: bool, named: bool) -> list[dict[str, Any]] | None:
    """vLLM's forced-call streaming (``tool_parsers/streaming.py``): the first delta carries the id, type, name and
    the arguments so far, later ones only new argument text (``name`` null for "required", absent for a named
    tool, whose every token gets a delta, empty ones included)."""
    call = choice.plan.call
    if call is None:
        return None
    first = choice.call_id is None
    arguments = choice.arguments_delta(finished)
    if arguments is None or (not arguments and not named):
        return None
    if first:
        choice.call_id = vllm_payloads.tool_call_id()
        function = {"name": call.name, "arguments": arguments}
        return [{"id": choice.call_id, "type": "function", "index": 0, "function": function}]
    return [{"index": 0, "function": {"arguments": arguments} if named else {"name": None, "arguments": arguments}}]


async def _chat_stream(
    replica: Replica, choices: list[Choice], body: ChatCompletionRequest, rid: str, created: int
) -> AsyncIterator[bytes]:
    """vLLM sends every choice's role chunk first and puts ``finish_reason`` on a choice's last chunk."""
    model = body.model
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    for choice in choices:
        first = {"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        first["finish_reason"] = None
        yield sse_event({**head, "choices": [first], "prompt_token_ids": None, "prompt_text": None})
    k = _top_k(body.top_logprobs, body.logprobs)
    named = isinstance(body.tool_choice, dict)
    parsing = replica.config.tool_call_parser is not None and replica.config.enable_auto_tool_choice
    async for choice, update in merged(choices):
        req = choice.req
        start = choice.tokens
        text, tokens = choice.advance(update)
        delta: dict[str, Any] = {"content": text}
        if not text and parsing:
            # With a parser the empty text parses to nothing: no chunk, or an empty delta to carry the finish or
            # the logprobs (without one, vLLM sends the empty text).
            if not update.finished and k is None:
                continue
            delta = {}
        if choice.plan.call is not None:
            calls = _tool_delta(choice, update.finished, named)
            delta = {"tool_calls": calls} if calls else {}
            if not calls and not update.finished:
                continue
        scores = vllm_payloads.chat_logprobs(choice.logprobs(tokens, start, k)) if k is not None else None
        answer: dict[str, Any] = {
            "index": choice.index,
            "delta": delta,
            "logprobs": scores,
            "finish_reason": None,
            "token_ids": None,
        }
        chunk = {**head, "choices": [answer]}
        if update.finished:
            reason = vllm_payloads.finish(req)
            if choice.called() and body.tool_choice == "required":
                reason = "tool_calls"
            answer["finish_reason"] = reason
            answer["stop_reason"] = vllm_payloads.stop_reason(req)
            if not body.include_usage:  # else the usage chunk carries it
                chunk["system_fingerprint"] = FINGERPRINT
        yield sse_event(chunk)
    if body.include_usage:
        usage = _usage(replica, [choice.req for choice in choices], chat=True, stream=True)
        yield sse_event({**head, "choices": [], "system_fingerprint": FINGERPRINT, "usage": usage})
    yield DONE


def _legacy(choice: Choice, k: int | None, tokens: list[str], start: int, offset: int) -> dict[str, Any] | None:
    if k is None:
        return None
    return logprobs.legacy(choice.logprobs(tokens, start, k), offset)


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
        choices = _choices(replica, input_ids, body, limit)
    except VllmError as refused:
        return refused.response()
    except (ValidationError, ValueError) as exc:
        return VllmError(str(exc).splitlines()[0]).response()
    rid, created = f"cmpl-{uuid.uuid4().hex[:16]}", int(time.time())
    head = {"id": rid, "object": "text_completion", "created": created, "model": body.model}
    k = None if body.logprobs is None else _top_k(body.logprobs, True)
    if body.stream:
        return EventStreamResponse(_completion_stream(replica, choices, body, head, k), on_close=close_all(choices))
    reqs = await results(choices, request.is_disconnected)
    answers = []
    for choice in choices:
        tokens = token_texts(choice.req, 0, len(choice.req.output_ids))
        legacy = _legacy(choice, k, tokens, 0, 0)
        answers.append(vllm_payloads.completion_choice(choice.index, choice.req, choice.text(), legacy, stream=False))
    return OrjsonResponse(
        {
            **head,
            "choices": answers,
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": _usage(replica, reqs, chat=False, stream=False),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


async def _completion_stream(
    replica: Replica, choices: list[Choice], body: CompletionRequest, head: dict[str, Any], k: int | None
) -> AsyncIterator[bytes]:
    async for choice, update in merged(choices):
        start, offset = choice.tokens, choice.chars
        text, tokens = choice.advance(update)
        legacy = _legacy(choice, k, tokens, start, offset)
        answer = vllm_payloads.completion_choice(
            choice.index, choice.req, text, legacy, stream=True, finished=update.finished
        )
        yield sse_event({**head, "choices": [answer]})
    if body.include_usage:
        usage = _usage(replica, [choice.req for choice in choices], chat=False, stream=True)
        yield sse_event({**head, "choices": [], "system_fingerprint": FINGERPRINT, "usage": usage})
    yield DONE
