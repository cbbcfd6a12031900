"""JSON bodies and stream chunks, field for field as SGLang serialises them."""

from __future__ import annotations

import time
from typing import Any

from spillgate.backends.sim.request import SimRequest


def finish_type(req: SimRequest) -> str | None:
    return req.finish_reason["type"] if req.finish_reason else None


def matched_stop(req: SimRequest) -> int | str | None:
    return req.finish_reason.get("matched") if req.finish_reason else None


def usage(req: SimRequest, *, cache_report: bool, completion_tokens: int | None = None) -> dict[str, Any]:
    """UsageInfo; ``prompt_tokens_details.cached_tokens`` as with ``--enable-cache-report``."""
    prompt = len(req.input_ids)
    completion = len(req.output_ids) if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens} if cache_report else None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def chat_completion(req: SimRequest, text: str, model: str, created: int, cache_report: bool) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "reasoning_content": None},
                "logprobs": None,
                "finish_reason": finish_type(req),
                "matched_stop": matched_stop(req),
            }
        ],
        "usage": usage(req, cache_report=cache_report),
        "metadata": metadata(req),
    }


def metadata(req: SimRequest) -> dict[str, Any]:
    """Which weights produced which output tokens (all of them the default weights, here)."""
    versions = [{"start": 0, "end": len(req.output_ids), "version": "default"}]
    return {"weight_version": "default", "weight_versions": versions}


def chat_chunk(
    req: SimRequest,
    model: str,
    created: int,
    *,
    role: str | None = None,
    content: str | None = None,
    finish_reason: str | None = None,
    matched: int | str | None = None,
    chunk_usage: dict[str, Any] | None = None,
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
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "matched_stop": matched}
        ],
    }
    if chunk_usage is not None:
        chunk["usage"] = chunk_usage
    return chunk


def usage_chunk(req: SimRequest, obj: str, model: str, created: int, cache_report: bool) -> dict[str, Any]:
    """The final chunk a stream sends when ``stream_options.include_usage`` is set. Completions write it without
    its null fields (``exclude_none``, ``serving_completions.py``); chat keeps them."""
    chunk_usage = usage(req, cache_report=cache_report)
    if obj == "text_completion":
        chunk_usage = {key: value for key, value in chunk_usage.items() if value is not None}
    return {"id": req.rid, "object": obj, "created": created, "model": model, "choices": [], "usage": chunk_usage}


def completion(req: SimRequest, text: str, model: str, created: int, cache_report: bool) -> dict[str, Any]:
    body = completion_chunk(req, text, model, created, finished=True, chunk_usage=usage(req, cache_report=cache_report))
    body["metadata"] = metadata(req)
    return body


def completion_chunk(
    req: SimRequest,
    text: str,
    model: str,
    created: int,
    *,
    finished: bool,
    chunk_usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_type(req) if finished else None,
                "matched_stop": matched_stop(req) if finished else None,
            }
        ],
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
