"""The Responses API's objects, field for field as each engine writes them (compared with
``tests/fixtures/<engine>/responses/``).

SGLang 0.5.23 (``entrypoints/openai/protocol.py``: ``ResponsesResponse``) echoes the request's sampling fields (null
when unset), writes ``metadata`` ``{}``, ``reasoning`` ``{"effort", "summary"}``, ``store`` and ``error``, and
``text`` ``{"format": {"type": "text"}}`` once the output is all text; its message items carry ``phase``
"final_answer"; its usage always has ``input_tokens_details.cached_tokens`` (the server always asks for it).
vLLM 0.32 (``responses/protocol.py``) writes the sampling values it used (``temperature`` 1.0, the output limit it
settled on), ``tool_choice`` "none" without tools, per-turn lists in its usage details and its own extra fields,
and no ``store`` or ``error``; its ids carry 16 hex digits, SGLang's 32.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from spillgate.backends.sim.responses_input import ResponsesBody

Engine = Literal["sglang", "vllm"]
Status = Literal["completed", "incomplete", "failed", "in_progress"]
_ECHOED_EFFORTS = frozenset({"minimal", "low", "medium", "high"})
"""The ``reasoning.effort`` values SGLang writes back (``ECHOABLE_REASONING_EFFORTS``)."""


def new_id(prefix: str, engine: Engine) -> str:
    """``resp_`` / ``msg_`` ids: SGLang a whole uuid4 hex, vLLM ``random_uuid()``'s 16 hex digits."""
    digits = uuid.uuid4().hex
    return f"{prefix}_{digits[:16] if engine == 'vllm' else digits}"


@dataclass(frozen=True)
class Counts:
    """The token counts a response's usage reports."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int


def output_text(text: str, *, engine: Engine, opening: bool = False) -> dict[str, Any]:
    """An ``output_text`` part; vLLM's opening (empty) part lists logprobs as ``[]``, every other one as null."""
    logprobs: list[Any] | None = [] if opening and engine == "vllm" else None
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(item_id: str, text: str | None, *, engine: Engine, done: bool) -> dict[str, Any]:
    """The assistant message: no parts while it streams (``text`` None), one ``output_text`` part when done (none
    for an empty reply: vLLM keeps the empty message, SGLang leaves it out, see :func:`output_items`)."""
    content = [output_text(text, engine=engine)] if text else []
    item: dict[str, Any] = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed" if done else "in_progress",
        "content": content,
        "phase": "final_answer" if engine == "sglang" else None,
    }
    return item


def output_items(item_id: str, text: str, *, engine: Engine) -> list[dict[str, Any]]:
    """A whole answer's output: SGLang writes a message only for non-empty text, vLLM (without a parser) always."""
    if not text and engine == "sglang":
        return []
    return [message_item(item_id, text, engine=engine, done=True)]


def usage(counts: Counts, *, engine: Engine) -> dict[str, Any]:
    total = counts.input_tokens + counts.output_tokens
    if engine == "sglang":
        return {
            "input_tokens": counts.input_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": counts.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total,
        }
    return {
        "input_tokens": counts.input_tokens,
        "input_tokens_details": {
            "cached_tokens": counts.cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": counts.output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": total,
    }


@dataclass(frozen=True)
class ResponseHead:
    """What a response object says besides its output, status and usage: fixed when the request is accepted."""

    response_id: str
    created_at: int
    model: str
    max_output_tokens: int | None
    """SGLang: the request's; vLLM: the limit it settled on (the context left when the request set none)."""


def response(
    body: ResponsesBody,
    head: ResponseHead,
    *,
    engine: Engine,
    output: list[dict[str, Any]],
    status: Status,
    counts: Counts | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object: whole, in a stream's lifecycle events, and as stored."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    if engine == "sglang":
        all_text = bool(output) and all(item.get("type") == "message" for item in output)
        text = body.text if body.text is not None else ({"format": {"type": "text"}} if all_text else None)
        effort = (body.reasoning or {}).get("effort")
        return {
            "id": head.response_id,
            "object": "response",
            "created_at": head.created_at,
            "model": head.model,
            "output": output,
            "status": status,
            "usage": usage(counts, engine=engine) if counts else None,
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "tool_choice": body.tool_choice,
            "tools": body.tools,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": effort if effort in _ECHOED_EFFORTS else None, "summary": None},
            "store": body.store,
            "temperature": body.temperature,
            "text": text,
            "top_p": body.top_p,
            "truncation": body.truncation,
            "user": body.user,
            "metadata": body.metadata or {},
        }
    return {
        "id": head.response_id,
        "created_at": head.created_at,
        "incomplete_details": incomplete,
        "instructions": body.instructions,
        "metadata": body.metadata,
        "model": head.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "tool_choice": body.tool_choice if body.tools or body.tool_choice not in ("auto", "none") else "none",
        "tools": body.tools,
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "background": bool(body.background),
        "max_output_tokens": head.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "previous_response_id": body.previous_response_id,
        "prompt": None,
        "reasoning": body.reasoning,
        "service_tier": body.service_tier,
        "status": status,
        "text": body.text,
        "top_logprobs": body.top_logprobs if body.wants_logprobs else None,
        "truncation": body.truncation,
        "usage": usage(counts, engine=engine) if counts else None,
        "user": body.user,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def error_body(message: str, *, err_type: str, code: int, param: str | None) -> dict[str, Any]:
    """Both engines answer the Responses routes with OpenAI's nested error."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
