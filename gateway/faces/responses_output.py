"""The Responses object (``"object": "response"``) a chat-completions answer becomes, whole or built up from a stream.

Every field the ``openai`` SDK's ``Response`` model requires is written, with the types it declares, so the SDK
parses it and serialises it again without a warning.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from spillgate.gateway.faces.responses_request import ResponsesRequest

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
"""Chat finish reasons that leave a response incomplete, and the reason it then gives."""


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: ``resp_``, ``msg_``, ``fc_`` and 48 hex digits."""
    return f"{prefix}_{os.urandom(24).hex()}"


@dataclass(slots=True)
class Turn:
    """One Responses request on its way through the chat handler: what its answer echoes and stores."""

    request: ResponsesRequest
    tenant: str
    history: list[dict[str, Any]]
    """The stored conversation it continues (chat messages, without instructions)."""
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))


@dataclass(slots=True)
class Answer:
    """What the model answered, as the chat answer said it: text, function calls, why it stopped, usage."""

    text: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    """``{"id", "call_id", "name", "arguments"}`` each, in order."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    message_id: str = field(default_factory=lambda: new_id("msg"))
    reasoning: str | None = None
    """What a reasoning model thought first (SGLang's ``reasoning_content``, vLLM's ``reasoning``); never carried
    into the next turn, as chat templates drop it from past turns too."""
    reasoning_id: str = field(default_factory=lambda: new_id("rs"))


def answer_of(chat: dict[str, Any]) -> Answer:
    """The answer in a whole chat completion (its first choice)."""
    answer = Answer(model=chat.get("model") if isinstance(chat.get("model"), str) else None)
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = message.get("content")
    answer.text = content if isinstance(content, str) else None
    answer.reasoning = reasoning_of(message) or None
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else new_id("call")
        answer.calls.append(
            {
                "id": new_id("fc"),
                "call_id": call_id,
                "name": str(function.get("name") or ""),
                "arguments": str(function.get("arguments") or ""),
            }
        )
    reason = choice.get("finish_reason")
    answer.finish_reason = reason if isinstance(reason, str) else None
    usage = chat.get("usage")
    answer.usage = usage if isinstance(usage, dict) else None
    return answer


def status_of(answer: Answer) -> str:
    return "incomplete" if answer.finish_reason in _INCOMPLETE else "completed"


def output_items(answer: Answer, status: str) -> list[dict[str, Any]]:
    """The output items: the message (when there is text, or nothing else), then one per function call."""
    items = [reasoning_item(answer.reasoning_id, answer.reasoning, "completed")] if answer.reasoning else []
    if answer.text or not answer.calls:
        items.append(message_item(answer.message_id, answer.text or "", status))
    items += [function_call_item(call, "completed") for call in answer.calls]
    return items


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message item; ``text`` None: just added, its content part not yet."""
    content = [] if text is None else [text_part(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_of(message: dict[str, Any]) -> str:
    """The reasoning text in a chat message or delta, under either engine's name for it."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A reasoning item; ``text`` None: just added, its content part not yet."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(call: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "id": call["id"],
        "type": "function_call",
        "call_id": call["call_id"],
        "name": call["name"],
        "arguments": call["arguments"],
        "status": status,
    }


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage as Responses usage."""
    if usage is None:
        return None
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": _count(prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": _count(
                completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else 0
            )
        },
        "total_tokens": _count(usage.get("total_tokens")) or prompt + completion,
    }


def response_object(
    turn: Turn,
    *,
    status: str,
    output: list[dict[str, Any]],
    answer: Answer | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole Responses object for ``turn`` in ``status``."""
    request = turn.request
    reason = _INCOMPLETE.get(answer.finish_reason or "") if answer is not None else None
    done = status in ("completed", "incomplete", "failed")
    return {
        "id": turn.id,
        "object": "response",
        "created_at": turn.created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": reason} if status == "incomplete" and reason else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata,
        "model": (answer.model if answer is not None and answer.model else None) or request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": request.reasoning_effort} if request.reasoning_effort is not None else None,
        "store": request.store,
        "temperature": request.temperature,
        "text": {"format": request.text_format},
        "tool_choice": request.tool_choice or "auto",
        "tools": [_echoed_tool(tool) for tool in request.tools],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": usage_of(answer.usage) if done and answer is not None else None,
        "user": request.user,
        **request.passed,
    }


def _echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
