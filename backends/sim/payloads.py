"""JSON bodies and stream chunks, field for field as SGLang serialises them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from spillgate.backends.sim.request import SimRequest


def finish_type(req: SimRequest) -> str | None:
    return req.finish_reason["type"] if req.finish_reason else None


def matched_stop(req: SimRequest) -> int | str | None:
    return req.finish_reason.get("matched") if req.finish_reason else None


def usage(
    req: SimRequest | Sequence[SimRequest], *, cache_report: bool, completion_tokens: int | None = None
) -> dict[str, Any]:
    """UsageInfo; ``prompt_tokens_details.cached_tokens`` as with ``--enable-cache-report``. Over ``n`` choices the
    prompt (and its cache hit) counts once and the completions add up."""
    reqs = [req] if isinstance(req, SimRequest) else list(req)
    prompt = len(reqs[0].input_ids)
    completion = sum(len(r.output_ids) for r in reqs) if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": reqs[0].cached_tokens} if cache_report else None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def chat_completion(
    reqs: Sequence[SimRequest], choices: list[dict[str, Any]], model: str, created: int, cache_report: bool
) -> dict[str, Any]:
    """The whole answer: the first choice's id, one usage over all choices."""
    return {
        "id": reqs[0].rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(reqs, cache_report=cache_report),
        "metadata": metadata(reqs[0]),
    }


def chat_choice(
    index: int,
    req: SimRequest,
    text: str,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice; a parsed tool call turns ``finish_reason`` "stop" into "tool_calls" with no ``matched_stop``
    (``serving_chat.py: _process_tool_calls``), and ``tool_calls`` is left out when there is none."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None}
    finish, matched = finish_type(req), matched_stop(req)
    if tool_calls:
        message["tool_calls"] = tool_calls
        if finish == "stop":
            finish, matched = "tool_calls", None
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}


def metadata(req: SimRequest) -> dict[str, Any]:
    """Which weights produced which output tokens (all of them the default weights, here; the first choice's)."""
    versions = [{"start": 0, "end": len(req.output_ids), "version": "default"}]
    return {"weight_version": "default", "weight_versions": versions}


def chat_chunk(
    req: SimRequest,
    model: str,
    created: int,
    *,
    index: int = 0,
    role: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    matched: int | str | None = None,
    chunk_usage: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; like SGLang, ``reasoning_content`` is always present in the delta."""
    delta: dict[str, Any] = {"reasoning_content": None}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    chunk: dict[str, Any] = {
        "id": req.rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
        ],
    }
    if chunk_usage is not None:
        chunk["usage"] = chunk_usage
    return chunk


def tool_call_chunk(
    req: SimRequest, model: str, created: int, index: int, call: dict[str, Any], chunk_usage: dict[str, Any] | None
) -> dict[str, Any]:
    """A streamed tool-call delta: SGLang writes every delta field (null ones too) and the chunk's ``usage``."""
    delta = {"role": None, "content": None, "reasoning_content": None, "tool_calls": [call]}
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None, "matched_stop": None}
    return {
        "id": req.rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": chunk_usage,
    }


def tool_call(call_id: str | None, index: int, name: str | None, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "index": index, "type": "function", "function": {"name": name, "arguments": arguments}}


def usage_chunk(
    req: SimRequest | Sequence[SimRequest], obj: str, model: str, created: int, cache_report: bool
) -> dict[str, Any]:
    """The final chunk a stream sends when ``stream_options.include_usage`` is set. Completions write it without
    its null fields (``exclude_none``, ``serving_completions.py``); chat keeps them."""
    reqs = [req] if isinstance(req, SimRequest) else list(req)
    chunk_usage = usage(reqs, cache_report=cache_report)
    if obj == "text_completion":
        chunk_usage = {key: value for key, value in chunk_usage.items() if value is not None}
    return {"id": reqs[0].rid, "object": obj, "created": created, "model": model, "choices": [], "usage": chunk_usage}


def completion(
    reqs: Sequence[SimRequest], choices: list[dict[str, Any]], model: str, created: int, cache_report: bool
) -> dict[str, Any]:
    return {
        "id": reqs[0].rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(reqs, cache_report=cache_report),
        "metadata": metadata(reqs[0]),
    }


def completion_choice(
    index: int, req: SimRequest, text: str, *, finished: bool, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_type(req) if finished else None,
        "matched_stop": matched_stop(req) if finished else None,
    }


def completion_chunk(
    req: SimRequest, model: str, created: int, choice: dict[str, Any], chunk_usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": chunk_usage,
    }


def meta_info(req: SimRequest, received_unix: float) -> dict[str, Any]:
    """/generate's meta_info, including the timing fields SGLang adds with metrics enabled."""
    info: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "weight_version": "default",
        "num_retractions": req.num_retractions,
        "reasoning_tokens": 0,
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "request_received_ts": received_unix,
    }
    if req.admitted_at is not None:
        info["queue_time"] = req.admitted_at - req.arrival
    if req.first_token_at is not None:
        info["first_token_latency"] = req.first_token_at - req.arrival
    if req.finished_at is not None:
        info["e2e_latency"] = req.finished_at - req.arrival
        info["request_finished_ts"] = time.time()
        decoded = len(req.output_ids) - 1
        if req.first_token_at is not None and decoded > 0 and req.finished_at > req.first_token_at:
            info["decode_throughput"] = decoded / (req.finished_at - req.first_token_at)
    return info
