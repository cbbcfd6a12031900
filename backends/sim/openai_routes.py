"""SGLang's OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from spillgate.backends.engines.sglang import final_assistant_as_user
from spillgate.backends.sim import logprobs, payloads
from spillgate.backends.sim.choices import Choice, close_all, merged, results, token_texts
from spillgate.backends.sim.client_features import ChoicePlan, forced_tools, plan_choice, sglang_problem
from spillgate.backends.sim.engine import GenerationParams, Update
from spillgate.backends.sim.errors import error_response
from spillgate.backends.sim.generation import request_seed
from spillgate.backends.sim.logprobs import MAX_TOP_LOGPROBS
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


def _submit_choices(
    replica: Replica,
    input_ids: list[int],
    body: ChatCompletionRequest | CompletionRequest,
    limit: int | None,
    plans: list[ChoicePlan] | None = None,
) -> list[Choice]:
    """One scheduled request per choice. A client limit (or ignore_eos) makes a free reply exactly that long, as
    max_tokens does on GPU; a reply a grammar fixes ends where its JSON does."""
    check_sampling(body)
    choices = []
    for index in range(body.n):
        plan = plans[index] if plans else ChoicePlan()
        params = GenerationParams(
            max_new_tokens=limit,
            exact_length=limit is not None or body.ignore_eos,
            seed=body.seed,
            rid=body.rid if index == 0 else None,
            cache_salt=body.cache_salt,
            extra_key=body.extra_key,
            priority=body.priority,
            stream=body.stream,
            choice=index,
            stop=body.stop_strings,
            script=plan.script,
        )
        choices.append(Choice(index, replica.engine.submit(input_ids, params), plan))
    return choices


def _plans(replica: Replica, input_ids: list[int], body: ChatCompletionRequest) -> list[ChoicePlan] | None:
    """Each choice's constrained reply, if the request forces a tool call or JSON."""
    tools = forced_tools(body.tools, body.tool_choice)
    if tools is None and not body.response_format:
        return None
    named = isinstance(body.tool_choice, dict)
    seeds = [request_seed(input_ids, replica.config.seed, body.seed, index) for index in range(body.n)]
    return [plan_choice(seed, tools, named, body.response_format, arguments_only=False) for seed in seeds]


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
    problem = sglang_problem(body.tools, body.tool_choice, body.response_format)
    if problem:
        return error_response(problem)
    messages = [message.model_dump(exclude_none=True) for message in body.messages]
    rendered = final_assistant_as_user({"messages": messages, "continue_final_message": body.continue_final_message})
    input_ids = body.input_ids or replica.chat_template.render(rendered, body.tools)
    try:
        choices = _submit_choices(replica, input_ids, body, body.token_limit, _plans(replica, input_ids, body))
    except ValueError as exc:
        return error_response(str(exc))
    created = int(time.time())
    if body.stream:
        return EventStreamResponse(_chat_stream(replica, choices, body, created), on_close=close_all(choices))
    reqs = await results(choices, request.is_disconnected)
    parsed = replica.config.tool_call_parser is not None
    answers = []
    for choice in choices:
        text = choice.text()
        calls = None
        if parsed and choice.called() and choice.plan.call is not None:
            calls = [payloads.tool_call(_call_id(), 0, choice.plan.call.name, choice.plan.call.arguments)]
            text = ""
        answers.append(
            payloads.chat_choice(
                choice.index, choice.req, text, tool_calls=calls, logprobs=_chat_logprobs(choice, body)
            )
        )
    cache_report = replica.config.enable_cache_report
    return OrjsonResponse(payloads.chat_completion(reqs, answers, body.model, created, cache_report))


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _chat_logprobs(
    choice: Choice, body: ChatCompletionRequest, tokens: list[str] | None = None, start: int = 0
) -> dict[str, Any] | None:
    """``{"content": [...]}`` for the whole reply, or for ``tokens`` from ``start`` (a stream's chunk)."""
    if not body.logprobs:
        return None
    if tokens is None:
        tokens = token_texts(choice.req, 0, len(choice.req.output_ids))
    k = min(max(body.top_logprobs or 0, 0), MAX_TOP_LOGPROBS)
    return {"content": logprobs.chat_content(choice.logprobs(tokens, start, k))}


async def _chat_stream(
    replica: Replica, choices: list[Choice], body: ChatCompletionRequest, created: int
) -> AsyncIterator[bytes]:
    model, cache_report = body.model, replica.config.enable_cache_report
    parsed = replica.config.tool_call_parser is not None
    started: set[int] = set()
    emitted = 0
    async for choice, update in merged(choices):
        req = choice.req
        # SGLang sends a choice's role chunk together with its first token, not before prefill: TTFT seen by a
        # client (or a gateway) starts at the first event.
        if choice.index not in started:
            started.add(choice.index)
            yield sse_event(payloads.chat_chunk(req, model, created, index=choice.index, role="assistant", content=""))
        start = choice.tokens
        text, tokens = choice.advance(update)
        emitted += len(update.new_ids)
        chunk_usage = None
        if body.continuous_usage_stats:
            chunk_usage = payloads.usage(req, cache_report=cache_report, completion_tokens=emitted)
        if parsed and choice.plan.call is not None:
            async for event in _tool_call_events(choice, update, model, created, chunk_usage):
                yield event
        elif text:
            chunk_logprobs = _chat_logprobs(choice, body, tokens, start)
            yield sse_event(
                payloads.chat_chunk(
                    req,
                    model,
                    created,
                    index=choice.index,
                    content=text,
                    chunk_usage=chunk_usage,
                    logprobs=chunk_logprobs,
                )
            )
        if update.finished:
            finish, matched = payloads.finish_type(req), payloads.matched_stop(req)
            if parsed and choice.called():
                finish, matched = "tool_calls", None
            yield sse_event(
                payloads.chat_chunk(req, model, created, index=choice.index, finish_reason=finish, matched=matched)
            )
    for choice in choices:  # a request that ended before its first token (max_tokens 0)
        if choice.index not in started:
            yield sse_event(
                payloads.chat_chunk(choice.req, model, created, index=choice.index, role="assistant", content="")
            )
    if body.include_usage:
        reqs = [choice.req for choice in choices]
        yield sse_event(payloads.usage_chunk(reqs, "chat.completion.chunk", model, created, cache_report))
    yield DONE


async def _tool_call_events(
    choice: Choice, update: Update, model: str, created: int, chunk_usage: dict[str, Any] | None
) -> AsyncIterator[bytes]:
    """SGLang's parser sends the call's id and name with empty arguments once the name is out, then the
    arguments as they grow (``JsonArrayParser``)."""
    call = choice.plan.call
    arguments = choice.arguments_delta(update.finished)
    if call is None or arguments is None:
        return
    if choice.call_id is None:
        choice.call_id = _call_id()
        first = payloads.tool_call(choice.call_id, 0, call.name, "")
        yield sse_event(payloads.tool_call_chunk(choice.req, model, created, choice.index, first, chunk_usage))
    if arguments:
        more = payloads.tool_call(None, 0, None, arguments)
        yield sse_event(payloads.tool_call_chunk(choice.req, model, created, choice.index, more, chunk_usage))


def _completion_prompt(replica: Replica, body: CompletionRequest) -> list[int]:
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        return [BEGIN_OF_TEXT, *replica.tokenizer.encode(prompt)]
    return list(prompt)


@router.post("/v1/completions", dependencies=[Depends(require_json)])
async def completions(body: CompletionRequest, request: Request, replica: ReplicaDep) -> Response:
    try:
        input_ids = _completion_prompt(replica, body)
        choices = _submit_choices(replica, input_ids, body, body.max_tokens)
    except ValueError as exc:
        return error_response(str(exc))
    created = int(time.time())
    echo = replica.tokenizer.decode(input_ids) if body.echo else ""
    if body.stream:
        stream = _completion_stream(replica, choices, body, created, echo)
        return EventStreamResponse(stream, on_close=close_all(choices))
    reqs = await results(choices, request.is_disconnected)
    answers = []
    for choice in choices:
        tokens = token_texts(choice.req, 0, len(choice.req.output_ids))
        answers.append(
            payloads.completion_choice(
                choice.index,
                choice.req,
                echo + choice.text(),
                finished=True,
                logprobs=_legacy_logprobs(choice, body, tokens, 0),
            )
        )
    cache_report = replica.config.enable_cache_report
    return OrjsonResponse(payloads.completion(reqs, answers, body.model, created, cache_report))


def _legacy_logprobs(choice: Choice, body: CompletionRequest, tokens: list[str], start: int) -> dict[str, Any] | None:
    """Completions' logprobs; SGLang leaves ``text_offset`` at -1 (it does not track offsets)."""
    if body.logprobs is None:
        return None
    k = min(max(body.logprobs, 0), MAX_TOP_LOGPROBS)
    shape = logprobs.legacy(choice.logprobs(tokens, start, k), 0)
    shape["text_offset"] = [-1] * len(tokens)
    return shape


async def _completion_stream(
    replica: Replica, choices: list[Choice], body: CompletionRequest, created: int, echo: str
) -> AsyncIterator[bytes]:
    model, cache_report = body.model, replica.config.enable_cache_report
    echoed: set[int] = set()
    emitted = 0
    async for choice, update in merged(choices):
        req = choice.req
        start = choice.tokens
        text, tokens = choice.advance(update)
        if choice.index not in echoed:
            echoed.add(choice.index)
            text = echo + text
        emitted += len(update.new_ids)
        chunk_usage = None
        if body.continuous_usage_stats:
            chunk_usage = payloads.usage(req, cache_report=cache_report, completion_tokens=emitted)
        answer = payloads.completion_choice(
            choice.index, req, text, finished=update.finished, logprobs=_legacy_logprobs(choice, body, tokens, start)
        )
        yield sse_event(payloads.completion_chunk(req, model, created, answer, chunk_usage))
    if body.include_usage:
        reqs = [choice.req for choice in choices]
        yield sse_event(payloads.usage_chunk(reqs, "text_completion", model, created, cache_report))
    yield DONE
