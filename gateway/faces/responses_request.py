"""Reading a Responses request (``POST /v1/responses``) and writing the chat-completions body it becomes.

Every field is checked here, so a bad one is a 400 naming the Responses parameter (``input[2].call_id``,
``max_output_tokens``), not the chat field it turns into. Conversation items become chat messages one way only
(:func:`input_messages`), and the assistant's answer is written back with the same helper
(:func:`assistant_message`): a turn rebuilt from a stored conversation, or from output items the client sends back
itself, is byte for byte the prompt the previous turn sent, so it lands on the replica that caches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spillgate.gateway.errors import ApiError
from spillgate.gateway.serving.validation import MAX_USER_CHARS

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
"""A message item's role as chat messages carry it: ``developer`` becomes ``system``, which every open model's
chat template knows (instructions are written as ``system`` too)."""
_TOOL_CHOICES = ("auto", "none", "required")
_UNSUPPORTED = {
    "background": "Background responses are not supported by this gateway.",
    "conversation": "Conversations are not supported by this gateway; chain responses with 'previous_response_id'.",
    "prompt": "Stored prompts are not supported by this gateway.",
}
"""Fields that change what a request means and that this gateway cannot honour: refused rather than ignored."""
MAX_METADATA_KEYS = 16
_PASSED = ("prompt_cache_key", "safety_identifier")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(slots=True)
class ResponsesRequest:
    """A checked Responses request: what the chat body is built from and what the answer echoes."""

    model: str
    messages: list[dict[str, Any]]
    """The new input as chat messages (without the instructions)."""
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    """As the client sent them (echoed in the answer)."""
    tool_choice: str | dict[str, Any] | None = None
    """None: not sent (the engine's default, ``auto`` with tools); echoed as ``auto``."""
    parallel_tool_calls: bool | None = None
    """None: not sent; echoed as true."""
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    store: bool = True
    stream: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    reasoning_effort: str | None = None
    """``reasoning.effort``, sent as chat's ``reasoning_effort`` (reasoning models on vLLM, SGLang and OpenAI)."""
    passed: dict[str, str] = field(default_factory=dict)
    """Fields chat completions has under the same name and meaning (``prompt_cache_key``, ``safety_identifier``)."""


def parse_request(payload: dict[str, Any], max_tokens: int) -> ResponsesRequest:
    """The checked request; raises a 400 :class:`ApiError` naming the first bad parameter."""
    for name, message in _UNSUPPORTED.items():
        if payload.get(name) not in (None, False):
            raise invalid(name, message, code="unsupported_parameter")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "'model' must be a non-empty string naming a route.", code="missing_required_parameter")
    if "input" not in payload:
        raise invalid("input", "'input' is required.", code="missing_required_parameter")
    request = ResponsesRequest(model=model, messages=input_messages(payload["input"]))
    request.instructions = _optional(payload, "instructions", str, "a string")
    request.tools = _tools(payload.get("tools"))
    request.tool_choice = _tool_choice(payload.get("tool_choice"))
    if payload.get("parallel_tool_calls") is not None:
        request.parallel_tool_calls = _flag(payload, "parallel_tool_calls", True)
    request.store = _flag(payload, "store", True)
    request.stream = _flag(payload, "stream", False)
    tokens = payload.get("max_output_tokens")
    if tokens is not None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise invalid("max_output_tokens", "'max_output_tokens' must be a positive integer.")
        if tokens > max_tokens:
            raise invalid("max_output_tokens", f"'max_output_tokens' is {tokens}; this gateway allows {max_tokens}.")
        request.max_output_tokens = tokens
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise invalid(name, f"'{name}' must be a number.")
        setattr(request, name, value)
    request.text_format = _text_format(payload.get("text"))
    previous = _optional(payload, "previous_response_id", str, "a string")
    if previous is not None and not previous:
        raise invalid("previous_response_id", "'previous_response_id' must not be empty.")
    request.previous_response_id = previous
    request.metadata = _metadata(payload.get("metadata"))
    user = _optional(payload, "user", str, "a string identifying your end user")
    if user is not None and len(user) > MAX_USER_CHARS:
        raise invalid("user", f"'user' is {len(user)} characters long; at most {MAX_USER_CHARS} are allowed.")
    request.user = user
    reasoning = payload.get("reasoning")
    if reasoning is not None:
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        if not isinstance(reasoning, dict) or (effort is not None and effort not in _EFFORTS):
            raise invalid("reasoning.effort", f"'reasoning.effort' must be one of {', '.join(_EFFORTS)}.")
        request.reasoning_effort = effort
    for name in _PASSED:
        value = _optional(payload, name, str, "a string")
        if value is not None:
            request.passed[name] = value
    return request


def chat_body(request: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body: instructions, then the stored conversation, then the new input."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    body: dict[str, Any] = {"model": request.model, "messages": [*messages, *history, *request.messages]}
    if request.tools:
        body["tools"] = [_chat_tool(tool) for tool in request.tools]
        # Sent only when given, as a chat client would: each engine then applies its own default.
        if request.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(request.tool_choice)
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p", "user"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    body.update(request.passed)
    response_format = _response_format(request.text_format)
    if response_format is not None:
        body["response_format"] = response_format
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # so response.completed carries usage
    return body


def assistant_message(text: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat message for an assistant turn: its text, and its function calls as ``tool_calls``
    (``{"call_id", "name", "arguments"}`` each). The one writer of assistant messages, so a conversation rebuilt
    from stored messages and one rebuilt from output items are the same bytes."""
    if not calls:
        return {"role": "assistant", "content": text or ""}
    tool_calls = [
        {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls
    ]
    return {"role": "assistant", "content": text or None, "tool_calls": tool_calls}


def input_messages(value: object) -> list[dict[str, Any]]:
    """``input`` (a string, or a list of items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "'input' must be a string or a non-empty array of input items.")
    messages: list[dict[str, Any]] = []
    pending: tuple[str | None, list[dict[str, Any]]] | None = None
    """An assistant turn being gathered: its text and function calls, which chat carries in one message."""
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise invalid(where, f"'{where}' must be an object.")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            continue  # this gateway writes none; a client may send back another model's
        if kind == "function_call":
            text, calls = pending if pending is not None else (None, [])
            pending = (text, [*calls, _function_call(item, where)])
            continue
        if kind == "message" and item.get("role") == "assistant":
            if pending is not None:
                messages.append(assistant_message(*pending))
            pending = (_text(item.get("content"), f"{where}.content"), [])
            continue
        if pending is not None:
            messages.append(assistant_message(*pending))
            pending = None
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call_output":
            messages.append(_function_output(item, where))
        else:
            raise invalid(
                f"{where}.type",
                f"'{where}.type' must be one of message, function_call, function_call_output; "
                f"{kind!r} is not supported by this gateway.",
            )
    if pending is not None:
        messages.append(assistant_message(*pending))
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise invalid(f"{where}.role", f"'{where}.role' must be one of user, system, developer, assistant.")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"'{where}.content' must be a string or an array of content parts.")
    parts = [_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": _ROLES[role], "content": parts[0]["text"]}
    return {"role": _ROLES[role], "content": parts}


def _part(part: object, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(part, dict) or kind is None:
        raise invalid(where, f"'{where}' must be a content part object with a 'type'.")
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid(f"{where}.text", f"'{where}.text' must be a string.")
        return {"type": "text", "text": text}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise invalid(f"{where}.image_url", "Images must be given by 'image_url' (a URL or a data URL).")
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise invalid(f"{where}.type", f"Content part type {kind!r} is not supported by this gateway.")


def _text(content: object, where: str) -> str:
    """An assistant message's text (its parts joined: chat templates expect assistant text as one string)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, f"'{where}' must be a string or an array of content parts.")
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if kind not in ("output_text", "input_text", "text", "refusal") or not isinstance(text, str):
            raise invalid(f"{where}[{index}]", f"'{where}[{index}]' must be an output_text part with a 'text' string.")
        texts.append(text)
    return "".join(texts)


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    call = {}
    for name in ("call_id", "name", "arguments"):
        value = item.get(name)
        if not isinstance(value, str) or (not value and name != "arguments"):
            raise invalid(f"{where}.{name}", f"'{where}.{name}' must be a non-empty string.")
        call[name] = value
    return call


def _function_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.call_id", f"'{where}.call_id' must be a non-empty string.")
    output = item.get("output")
    if isinstance(output, list):
        output = _text(output, f"{where}.output")
    if not isinstance(output, str):
        raise invalid(f"{where}.output", f"'{where}.output' must be a string.")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _tools(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "'tools' must be an array.")
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise invalid(where, f"'{where}' must be an object.")
        if tool.get("type") != "function":
            raise invalid(
                f"{where}.type",
                f"Tool type {tool.get('type')!r} is not supported by this gateway; only 'function' tools are.",
                code="unsupported_tool",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise invalid(f"{where}.name", f"'{where}.name' must be a non-empty string.")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise invalid(f"{where}.parameters", f"'{where}.parameters' must be a JSON schema object.")
        if tool.get("description") is not None and not isinstance(tool["description"], str):
            raise invalid(f"{where}.description", f"'{where}.description' must be a string.")
        if tool.get("strict") is not None and not isinstance(tool["strict"], bool):
            raise invalid(f"{where}.strict", f"'{where}.strict' must be a boolean.")
    return value


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"]}
    for name in ("description", "parameters", "strict"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


def _tool_choice(value: object) -> str | dict[str, Any] | None:
    if value is None:
        return None
    if value in _TOOL_CHOICES:
        return value  # type: ignore[return-value]
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "name": value["name"]}
    raise invalid("tool_choice", "'tool_choice' must be auto, none, required, or {'type': 'function', 'name': ...}.")


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice["name"]}}


def _text_format(value: object) -> dict[str, Any]:
    if value is None:
        return {"type": "text"}
    if not isinstance(value, dict):
        raise invalid("text", "'text' must be an object.")
    fmt = value.get("format")
    if fmt is None:
        return {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid("text.format", "'text.format.type' must be text, json_object or json_schema.")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise invalid("text.format.schema", "A json_schema format needs a 'schema' object.")
        if not isinstance(fmt.get("name"), str) or not fmt["name"]:
            raise invalid("text.format.name", "A json_schema format needs a 'name'.")
    return fmt  # type: ignore[return-value]


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "description", "strict") if fmt.get(key) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return None


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid("metadata", "'metadata' must be an object of string values.")
    if len(value) > MAX_METADATA_KEYS:
        raise invalid("metadata", f"'metadata' may hold at most {MAX_METADATA_KEYS} keys.")
    return value


def _flag(payload: dict[str, Any], name: str, default: bool) -> bool:
    value = payload.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"'{name}' must be a boolean.")
    return value


def _optional(payload: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = payload.get(name)
    if value is not None and not isinstance(value, kind):
        raise invalid(name, f"'{name}' must be {what}.")
    return value


def invalid(param: str, message: str, *, code: str = "invalid_value") -> ApiError:
    """A 400 in OpenAI's shape naming the Responses parameter."""
    return ApiError(400, message, param=param, code=code)
