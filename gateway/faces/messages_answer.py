"""A chat completion as Anthropic's ``message``: content blocks, stop reason and usage.

Anthropic counts input differently from OpenAI: its ``input_tokens`` are only those neither read from nor
written to the prompt cache, which it reports apart (``cache_read_input_tokens``,
``cache_creation_input_tokens``); OpenAI's ``prompt_tokens`` hold all three.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson

log = logging.getLogger("spillgate.faces")

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def message_id() -> str:
    """An id shaped like Anthropic's."""
    return "msg_" + os.urandom(12).hex()


def tool_use_id(given: object) -> str:
    """The backend's id for a tool call, or one of Anthropic's shape when it gave none."""
    return given if isinstance(given, str) and given else "toolu_" + os.urandom(12).hex()


def usage(chat_usage: object) -> dict[str, int]:
    """Anthropic's ``usage`` from OpenAI's (zeros when none came)."""
    if not isinstance(chat_usage, dict):
        chat_usage = {}
    prompt = _count(chat_usage.get("prompt_tokens"))
    details = chat_usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = _count(details.get("cached_tokens"))
    written = _count(details.get("cache_creation_tokens"))
    return {
        "input_tokens": max(prompt - read - written, 0),
        "output_tokens": _count(chat_usage.get("completion_tokens")),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def stop_reason(finish_reason: object, matched: object, stop_sequences: tuple[str, ...]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a chat finish reason. ``matched`` is the stop string
    the backend says it hit (SGLang's ``matched_stop``, vLLM's ``stop_reason``), when it says."""
    if finish_reason == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish_reason, "end_turn") if isinstance(finish_reason, str) else "end_turn", None


def matched_stop(choice: dict[str, Any]) -> object:
    """The stop string a choice says it ended on, if any."""
    matched = choice.get("matched_stop")
    return matched if matched is not None else choice.get("stop_reason")


def tool_input(arguments: object) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic's ``input`` is; what is not a JSON object is kept whole
    under ``_raw`` rather than lost."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        log.info("a tool call's arguments are not JSON: %.80r", arguments)
        return {"_raw": arguments}
    return parsed if isinstance(parsed, dict) else {"_raw": arguments}


def whole_message(chat: dict[str, Any], model: str, stop_sequences: tuple[str, ...]) -> dict[str, Any]:
    """Anthropic's ``message`` for a whole chat completion; ``model`` is the name the client asked for."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.get("id")),
                "name": function["name"],
                "input": tool_input(function.get("arguments")),
            }
        )
    reason, sequence = stop_reason(choice.get("finish_reason"), matched_stop(choice), stop_sequences)
    if reason == "end_turn" and any(block["type"] == "tool_use" for block in content):
        reason = "tool_use"  # a backend that called a tool but said only "stop"
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(chat.get("usage")),
    }
