"""An Anthropic Messages request as a chat-completions body.

Every field Anthropic's API takes is either translated or refused by name with a 400, so a client never
learns only from a model's odd answer that a field was dropped. Content blocks map to chat content parts
(text, images as ``image_url``), ``tool_use`` blocks to an assistant's ``tool_calls`` and ``tool_result``
blocks to ``tool`` messages. A block's ``cache_control`` stays on its part when the route may send the
request to one of Anthropic's models, where litellm hands it on; elsewhere it is dropped, as replicas have no
use for it and OpenAI's API refuses fields it does not know.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from spillgate.gateway.control.config import LimitsConfig
from spillgate.gateway.errors import ApiError
from spillgate.gateway.serving.validation import MAX_USER_CHARS, parse_json_object

_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "service_tier",
    }
)
_UNSUPPORTED = frozenset({"thinking", "mcp_servers", "container", "context_management", "output_format"})
"""Anthropic fields with no chat-completions equivalent: refused by name rather than silently dropped."""
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
"""Blocks a client replays from an earlier answer that no chat backend can take: left out of the history."""


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """The chat body to send, and what the answer's translation needs to know of the request."""

    chat: dict[str, Any]
    model: str
    stop_sequences: tuple[str, ...]


def translate_request(body: bytes, limits: LimitsConfig, caching: Callable[[str], bool]) -> MessagesRequest:
    """The chat-completions request for an Anthropic Messages body; raises a 400 :class:`ApiError` for bad input.
    ``caching`` says whether a model (a route's name) keeps ``cache_control`` on content parts."""
    payload = parse_json_object(body)
    for name in payload:
        if name in _UNSUPPORTED:
            raise invalid(name, f"'{name}' is not supported by this gateway.")
        if name not in _FIELDS:
            raise invalid(name, f"{name}: Extra inputs are not permitted")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "model: Field required (a non-empty string naming a model)")
    chat: dict[str, Any] = {"model": model, "max_tokens": _max_tokens(payload.get("max_tokens"), limits)}
    messages = _system(payload.get("system"))
    messages += _messages(payload.get("messages"), limits)
    chat["messages"] = messages if caching(model) else [_uncached(message) for message in messages]
    stop = _stop_sequences(payload.get("stop_sequences"))
    if stop:
        chat["stop"] = list(stop)
    for name, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = payload.get(name)
        if value is not None:
            chat[name] = _number(name, value, low, high)
    top_k = payload.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise invalid("top_k", "top_k: must be a non-negative integer")
        chat["top_k"] = top_k
    user = _user(payload.get("metadata"))
    if user:
        chat["user"] = user
    _service_tier(payload.get("service_tier"))
    tools = _tools(payload.get("tools"))
    if tools:
        chat["tools"] = tools
    chat.update(_tool_choice(payload.get("tool_choice"), bool(tools)))
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream", "stream: must be a boolean")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # message_delta carries the usage
    return MessagesRequest(chat=chat, model=model, stop_sequences=stop)


def _uncached(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without ``cache_control`` on its parts (checked, but of no use where it goes)."""
    content = message.get("content")
    if isinstance(content, list) and any("cache_control" in part for part in content):
        parts = [{key: value for key, value in part.items() if key != "cache_control"} for part in content]
        if message["role"] == "assistant":
            return {**message, "content": _joined(parts)}
        return {**message, "content": parts}
    return message


def invalid(param: str, message: str) -> ApiError:
    """A 400 about the request, Anthropic's ``invalid_request_error``."""
    return ApiError(400, message, param=param, code="invalid_request")


def _max_tokens(value: object, limits: LimitsConfig) -> int:
    if value is None:
        raise invalid("max_tokens", "max_tokens: Field required")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid("max_tokens", "max_tokens: must be a positive integer")
    if value > limits.max_tokens:
        raise invalid("max_tokens", f"max_tokens: {value} > {limits.max_tokens}, the most this gateway allows")
    return value


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise invalid(name, f"{name}: must be a number from {low:g} to {high:g}")
    return value


def _stop_sequences(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise invalid("stop_sequences", "stop_sequences: must be an array of non-empty strings")
    return tuple(value)


def _user(metadata: object) -> str:
    if metadata is None:
        return ""
    if not isinstance(metadata, dict):
        raise invalid("metadata", "metadata: must be an object")
    for key in metadata:
        if key != "user_id":
            raise invalid(f"metadata.{key}", f"metadata.{key}: Extra inputs are not permitted")
    user = metadata.get("user_id")
    if user is None:
        return ""
    if not isinstance(user, str) or len(user) > MAX_USER_CHARS:
        raise invalid("metadata.user_id", f"metadata.user_id: must be a string of at most {MAX_USER_CHARS} characters")
    return user


def _service_tier(value: object) -> None:
    """Accepted and ignored: the gateway's own routing decides where a request runs."""
    if value is not None and value not in ("auto", "standard_only"):
        raise invalid("service_tier", "service_tier: must be 'auto' or 'standard_only'")


def _system(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    if isinstance(value, list):
        parts = [_text_part(block, f"system.{i}") for i, block in enumerate(value)]
        return [{"role": "system", "content": parts}] if parts else []
    raise invalid("system", "system: must be a string or an array of text blocks")


def _messages(value: object, limits: LimitsConfig) -> list[dict[str, Any]]:
    if value is None:
        raise invalid("messages", "messages: Field required")
    if not isinstance(value, list) or not value:
        raise invalid("messages", "messages: must be a non-empty array")
    if len(value) > limits.max_messages:
        raise invalid("messages", f"messages: at most {limits.max_messages} messages are allowed, got {len(value)}")
    chat: list[dict[str, Any]] = []
    for index, message in enumerate(value):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise invalid(where, f"{where}: must be an object with 'role' and 'content'")
        for key in message:
            if key not in ("role", "content"):
                raise invalid(f"{where}.{key}", f"{where}.{key}: Extra inputs are not permitted")
        role, content = message.get("role"), message.get("content")
        if role == "user":
            chat += _user_message(content, where)
        elif role == "assistant":
            chat.append(_assistant_message(content, where))
        else:
            raise invalid(f"{where}.role", f"{where}.role: must be 'user' or 'assistant'")
    if not chat:
        raise invalid("messages", "messages: none holds a block a model reads (thinking blocks are left out)")
    return chat


def _blocks(content: object, where: str) -> list[dict[str, Any]]:
    """``content`` as a list of typed blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"{where}.content: must be a string or an array of content blocks")
    if not content:
        raise invalid(f"{where}.content", f"{where}.content: must hold at least one block")
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid(f"{where}.content.{index}", f"{where}.content.{index}: must be a block with a 'type'")
    return content


def _user_message(content: object, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results first, as ``tool`` messages, then the rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, where)):
        at = f"{where}.content.{index}"
        kind = block["type"]
        if kind == "tool_result":
            message, images = _tool_result(block, at)
            results.append(message)
            parts += images
        elif kind == "text":
            parts.append(_text_part(block, at))
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise invalid(f"{at}.type", f"{at}.type: '{kind}' blocks are not supported in a user message")
    return results + ([{"role": "user", "content": parts}] if parts else [])


def _assistant_message(content: object, where: str) -> dict[str, Any]:
    """An assistant turn: its text as the content, its ``tool_use`` blocks as ``tool_calls``."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(_blocks(content, where)):
        at = f"{where}.content.{index}"
        kind = block["type"]
        if kind == "text":
            parts.append(_text_part(block, at))
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise invalid(f"{at}.type", f"{at}.type: '{kind}' blocks are not supported in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": _joined(parts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    """An assistant's text parts as one string (what every chat backend takes), or the parts when one asks to
    be cached."""
    if any("cache_control" in part for part in parts):
        return parts
    return "".join(part["text"] for part in parts) if parts else None


def _text_part(block: object, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise invalid(where, f"{where}: must be a text block")
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(f"{where}.text", f"{where}.text: Field required (a string)")
    part: dict[str, Any] = {"type": "text", "text": text}
    return _cached(part, block, where)


def _cached(part: dict[str, Any], block: dict[str, Any], where: str) -> dict[str, Any]:
    """``part`` with the block's ``cache_control`` kept, once checked."""
    control = block.get("cache_control")
    if control is None:
        return part
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise invalid(f"{where}.cache_control", f"{where}.cache_control: must be {{'type': 'ephemeral'}}")
    ttl = control.get("ttl")
    if ttl is not None and ttl not in ("5m", "1h"):
        raise invalid(f"{where}.cache_control.ttl", f"{where}.cache_control.ttl: must be '5m' or '1h'")
    part["cache_control"] = dict(control)
    return part


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        assert isinstance(source, dict)
        media, data = source.get("media_type"), source.get("data")
        if media not in _IMAGE_TYPES:
            raise invalid(f"{where}.source.media_type", f"{where}.source.media_type: one of {sorted(_IMAGE_TYPES)}")
        if not isinstance(data, str) or not data:
            raise invalid(f"{where}.source.data", f"{where}.source.data: Field required (base64 image data)")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        assert isinstance(source, dict)
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise invalid(f"{where}.source.url", f"{where}.source.url: must be an http(s) URL")
    else:
        raise invalid(f"{where}.source", f"{where}.source: must be a 'base64' or 'url' image source")
    return _cached({"type": "image_url", "image_url": {"url": url}}, block, where)


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.id", f"{where}.id: Field required")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name", f"{where}.name: Field required")
    if not isinstance(arguments, dict):
        raise invalid(f"{where}.input", f"{where}.input: must be an object")
    function = {"name": name, "arguments": orjson.dumps(arguments).decode()}
    return {"id": call_id, "type": "function", "function": function}


def _tool_result(block: dict[str, Any], where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``tool`` message for a result, and its images (a chat ``tool`` message carries text only: they
    follow in the user message)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.tool_use_id", f"{where}.tool_use_id: Field required")
    content = block.get("content", "")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for index, inner in enumerate(content):
            at = f"{where}.content.{index}"
            kind = inner.get("type") if isinstance(inner, dict) else None
            if kind == "text":
                texts.append(_text_part(inner, at)["text"])
            elif kind == "image":
                assert isinstance(inner, dict)
                images.append(_image_part(inner, at))
            else:
                raise invalid(at, f"{at}: a tool result holds text and image blocks only")
    else:
        raise invalid(f"{where}.content", f"{where}.content: must be a string or an array of blocks")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise invalid(f"{where}.is_error", f"{where}.is_error: must be a boolean")
    text = "".join(texts)
    if is_error:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}, images


def _tools(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "tools: must be an array")
    tools = []
    for index, tool in enumerate(value):
        where = f"tools.{index}"
        if not isinstance(tool, dict):
            raise invalid(where, f"{where}: must be an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise invalid(f"{where}.type", f"{where}.type: server tools ('{kind}') are not supported by this gateway")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}.name", f"{where}.name: Field required")
        if not isinstance(schema, dict):
            raise invalid(f"{where}.input_schema", f"{where}.input_schema: Field required (a JSON schema object)")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise invalid(f"{where}.description", f"{where}.description: must be a string")
            function["description"] = description
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: object, has_tools: bool) -> dict[str, Any]:
    """The chat fields for Anthropic's ``tool_choice``."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict) or kind not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice", "tool_choice: must be an object whose type is auto, any, tool or none")
    if kind == "none":
        return {"tool_choice": "none"} if has_tools else {}
    if not has_tools:
        raise invalid("tool_choice", f"tool_choice: '{kind}' needs 'tools'")
    fields: dict[str, Any] = {}
    if kind == "auto":
        fields["tool_choice"] = "auto"
    elif kind == "any":
        fields["tool_choice"] = "required"
    else:
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("tool_choice.name", "tool_choice.name: Field required")
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    disable = value.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise invalid("tool_choice.disable_parallel_tool_use", "disable_parallel_tool_use: must be a boolean")
        if disable:
            fields["parallel_tool_calls"] = False
    return fields
