"""vLLM 0.32's choice, message, tool-call and logprobs objects (``entrypoints/openai/chat_completion/protocol.py``,
``completion/protocol.py``), field for field, for the simulator's vLLM face."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from spillgate.backends.sim import logprobs
from spillgate.backends.sim.request import SimRequest


def finish(req: SimRequest) -> str | None:
    return req.finish_reason["type"] if req.finish_reason else None


def stop_reason(req: SimRequest) -> str | None:
    """vLLM's ``stop_reason``: the stop string that ended the reply (None for end-of-sequence or a limit)."""
    matched = req.finish_reason.get("matched") if req.finish_reason else None
    return matched if isinstance(matched, str) else None


def tool_call_id() -> str:
    """``make_tool_call_id``: ``random_uuid()``, 16 hex digits in 0.32."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"


def message(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The assistant message; ``tool_calls`` is written only when the reply holds calls."""
    body: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    if tool_calls:
        body["tool_calls"] = tool_calls
    return body


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": tool_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_choice(
    index: int, req: SimRequest, body: dict[str, Any], chat_logprobs: dict[str, Any] | None, finish_reason: str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": body,
        "logprobs": chat_logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason(req),
        "token_ids": None,
        "routed_experts": None,
    }


def chat_logprobs(items: Sequence[logprobs.TokenScore]) -> dict[str, Any]:
    return {"content": logprobs.chat_content(items)}


def completion_choice(
    index: int, req: SimRequest, text: str, legacy: dict[str, Any] | None, *, stream: bool, finished: bool = True
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": legacy,
        "finish_reason": finish(req) if finished else None,
        "stop_reason": stop_reason(req) if finished else None,
        "token_ids": None,
    }
    if not stream:
        choice["prompt_logprobs"] = None
    choice["prompt_token_ids"] = None
    if not stream:
        choice["routed_experts"] = None
    return choice
