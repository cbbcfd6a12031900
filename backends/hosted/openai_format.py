"""litellm's response objects as OpenAI's JSON, whatever the provider's own wire format was.

litellm already translates (Anthropic's events become ``chat.completion.chunk`` objects), but its
objects carry extras (``provider_specific_fields``, ``thinking_blocks``, cost) and many nulls; the
client gets OpenAI's fields only.
"""

from __future__ import annotations

from typing import Any

from spillgate.backends.hosted.response import Usage

_HEAD = ("id", "created", "model", "system_fingerprint", "service_tier")
_MESSAGE = ("role", "content", "reasoning_content", "tool_calls", "function_call", "refusal", "audio", "annotations")


def _compact(value: Any) -> Any:
    """``value`` without None entries in its dicts, at every depth."""
    if isinstance(value, dict):
        return {key: _compact(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


def _head(raw: dict[str, Any], kind: str) -> dict[str, Any]:
    head = {key: raw[key] for key in _HEAD if raw.get(key) is not None}
    return {"id": head.pop("id", ""), "object": kind, **head}


def usage_from(raw: dict[str, Any] | None) -> Usage | None:
    """Usage from litellm's usage dict (OpenAI's fields, or Anthropic's as litellm maps them)."""
    if not raw:
        return None
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens")
    if cached is None:
        cached = raw.get("cache_read_input_tokens") or 0
    written = prompt_details.get("cache_creation_tokens")
    if written is None:
        written = raw.get("cache_creation_input_tokens") or 0
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        cached_tokens=int(cached),
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
        cache_write_tokens=int(written),
    )


def chunk_json(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``chat.completion.chunk`` from a litellm stream chunk (``model_dump()``), without usage."""
    choices = [
        {
            "index": choice.get("index", 0),
            "delta": {
                key: _compact(value)
                for key, value in (choice.get("delta") or {}).items()
                if key in _MESSAGE and value is not None
            },
            "logprobs": choice.get("logprobs"),
            "finish_reason": choice.get("finish_reason"),
        }
        for choice in raw.get("choices") or ()
    ]
    return {**_head(raw, "chat.completion.chunk"), "choices": choices}


def completion_json(raw: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
    """A ``chat.completion`` from litellm's ModelResponse (``model_dump()``)."""
    choices = []
    for choice in raw.get("choices") or ():
        message = {key: _compact(value) for key, value in (choice.get("message") or {}).items() if key in _MESSAGE}
        message.setdefault("role", "assistant")
        message.setdefault("content", None)
        if not message.get("tool_calls"):
            message.pop("tool_calls", None)
        for key in ("function_call", "audio", "reasoning_content"):
            if message.get(key) is None:
                message.pop(key, None)
        choices.append(
            {
                "index": choice.get("index", 0),
                "message": message,
                "logprobs": choice.get("logprobs"),
                "finish_reason": choice.get("finish_reason"),
            }
        )
    body = {**_head(raw, "chat.completion"), "choices": choices}
    if usage is not None:
        body["usage"] = usage.to_openai()
    return body
