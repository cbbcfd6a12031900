"""Checking OpenAI request bodies before anything is sent upstream.

Hand-written rather than a pydantic model because the body must be forwarded as the client sent it
(unknown fields pass through untouched) and because this runs on every request: these checks cost a
few microseconds. A malformed body is a 400; well-formed JSON with a wrong field is a 422 naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from spillgate.gateway.control.config import LimitsConfig
from spillgate.gateway.errors import ApiError

CHARS_PER_TOKEN = 4
MAX_NESTING = 254
"""How deep orjson serializes: what a body may nest to, as it must be serialized again to be forwarded."""
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_NUMBER_FIELDS = ("temperature", "top_p", "frequency_penalty", "presence_penalty")
_NON_TEXT_PART_CHARS = 4 * 1024
"""An image or audio part counted as about a thousand tokens: what a typical image costs a vision model."""
MAX_USER_CHARS = 256
"""OpenAI's ``user``, an end-user id the ledger keeps with each request: long enough for any id or email
address, short enough that a ledger row stays small."""


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """The fields routing needs; the body itself is forwarded as received, ``model`` rewritten."""

    payload: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int
    """The largest output limit the body sets (``max_tokens`` or ``max_completion_tokens``); 0 when none."""
    prompt_tokens: int
    choices: int = 1
    """Completions asked for (``n``, or ``best_of`` when larger): each may produce ``max_tokens``."""
    body_bytes: int = 0
    """The body's size: a bound on its prompt tokens that holds for any language (reservations use it)."""
    user: str = ""
    """OpenAI's ``user`` (the caller's end user), booked with the request; empty when not sent."""


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "Request body must be a JSON object.", code="invalid_json")
    # The parser accepts nesting the serializer refuses when the body is forwarded: refused here instead.
    # Counting brackets is a C-speed bound on the depth, so only a body that could be that deep is serialized.
    if body.count(b"[") + body.count(b"{") > MAX_NESTING:
        try:
            orjson.dumps(payload)
        except orjson.JSONEncodeError:
            raise ApiError(
                400, f"Request body is nested more than {MAX_NESTING} levels deep.", code="invalid_json"
            ) from None
    return payload


def parse_chat_request(body: bytes, limits: LimitsConfig) -> ParsedRequest:
    payload = parse_json_object(body)
    messages = payload.get("messages")
    if messages is None:
        raise _invalid("messages", "'messages' is required.", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "'messages' must be a non-empty array.")
    if len(messages) > limits.max_messages:
        raise _invalid("messages", f"At most {limits.max_messages} messages are allowed, got {len(messages)}.")
    chars = 0
    for index, message in enumerate(messages):
        chars += _message_chars(message, f"messages[{index}]")
    tools = payload.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid("tools", "'tools' must be an array.")
        chars += len(orjson.dumps(tools))
    return _common(payload, limits, chars, len(body), "max_completion_tokens", "max_tokens")


def parse_completion_request(body: bytes, limits: LimitsConfig) -> ParsedRequest:
    payload = parse_json_object(body)
    if "prompt" not in payload:
        raise _invalid("prompt", "'prompt' is required.", code="missing_required_parameter")
    return _common(payload, limits, _prompt_chars(payload["prompt"]), len(body), "max_tokens")


_ENCODINGS = ("float", "base64")


def parse_embedding_request(body: bytes, limits: LimitsConfig) -> ParsedRequest:
    """An embeddings body: ``input`` as OpenAI takes it (a string, strings, token ids, lists of token ids), never
    streamed, nothing generated. Its prompt tokens are estimated as a completion's."""
    payload = parse_json_object(body)
    if "input" not in payload:
        raise _invalid("input", "'input' is required.", code="missing_required_parameter")
    chars = _input_chars(payload["input"])
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "'model' must be a non-empty string naming a route.")
    if payload.get("stream") not in (None, False):
        raise _invalid("stream", "Embeddings are not streamed: leave 'stream' out.")
    encoding = payload.get("encoding_format")
    if encoding is not None and encoding not in _ENCODINGS:
        raise _invalid("encoding_format", f"'encoding_format' must be one of {', '.join(_ENCODINGS)}.")
    dimensions = payload.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise _invalid("dimensions", "'dimensions' must be a positive integer.")
    return ParsedRequest(
        payload=payload,
        model=model,
        stream=False,
        include_usage=False,
        max_tokens=0,
        prompt_tokens=chars // CHARS_PER_TOKEN + 1,
        body_bytes=len(body),
        user=_user(payload.get("user")),
    )


def _input_chars(value: object) -> int:
    """``input``'s length in characters (a token id counting as a token's worth), or a 422 naming it."""
    try:
        return _prompt_chars(value)
    except ApiError:
        raise _invalid(
            "input", "'input' must be a string, an array of strings, an array of token ids, or an array of such arrays."
        ) from None


def _common(
    payload: dict[str, Any], limits: LimitsConfig, chars: int, body_bytes: int, *token_fields: str
) -> ParsedRequest:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "'model' must be a non-empty string naming a route.")
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _invalid("stream", "'stream' must be a boolean.")
    include_usage = False
    options = payload.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _invalid("stream_options", "'stream_options' must be an object.")
        if not stream:
            raise _invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _invalid("stream_options.include_usage", "'include_usage' must be a boolean.")
    _check_response_format(payload.get("response_format"))
    for name in _NUMBER_FIELDS:
        value = payload.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _invalid(name, f"'{name}' must be a number.")
    max_tokens = 0
    for name in token_fields:
        value = payload.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _invalid(name, f"'{name}' must be a positive integer.")
        if value > limits.max_tokens:
            raise _invalid(name, f"'{name}' is {value}; this gateway allows at most {limits.max_tokens}.")
        max_tokens = max(max_tokens, value)  # whichever the backend honours, the worst case is the larger
    choices = 1
    for name in ("n", "best_of"):
        value = payload.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limits.max_choices:
            raise _invalid(name, f"'{name}' must be an integer from 1 to {limits.max_choices}.")
        choices = max(choices, value)
    user = _user(payload.get("user"))
    return ParsedRequest(
        payload=payload,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        prompt_tokens=chars // CHARS_PER_TOKEN + 1,
        choices=choices,
        body_bytes=body_bytes,
        user=user,
    )


def _user(user: object) -> str:
    """OpenAI's ``user``, checked: a string of at most :data:`MAX_USER_CHARS`; empty when not sent."""
    if user is None:
        return ""
    if not isinstance(user, str):
        raise _invalid("user", "'user' must be a string identifying your end user.")
    if len(user) > MAX_USER_CHARS:
        raise _invalid("user", f"'user' is {len(user)} characters long; at most {MAX_USER_CHARS} are allowed.")
    return user


_RESPONSE_FORMATS = ("text", "json_object", "json_schema", "structural_tag")
"""OpenAI's response formats, and SGLang's ``structural_tag``."""


def _check_response_format(value: object) -> None:
    """Refused here with its field named: a hosted provider's SDK would reject it only after routing, as a
    provider error."""
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _RESPONSE_FORMATS:
        raise _invalid(
            "response_format",
            f"'response_format' must be an object whose 'type' is one of {', '.join(_RESPONSE_FORMATS)}.",
        )
    if kind == "json_schema" and not isinstance(value.get("json_schema"), dict):
        raise _invalid("response_format.json_schema", "A 'json_schema' response format needs a 'json_schema' object.")


def _message_chars(message: object, where: str) -> int:
    if not isinstance(message, dict):
        raise _invalid(where, f"'{where}' must be an object with 'role' and 'content'.")
    role = message.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _invalid(f"{where}.role", f"'{where}.role' must be one of {sorted(_ROLES)}.")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return len(content or "") + 8
    if isinstance(content, list):
        chars = 8
        for index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise _invalid(f"{where}.content[{index}]", "Each content part must be an object with a 'type'.")
            text = part.get("text")
            if part["type"] == "text" and not isinstance(text, str):
                raise _invalid(f"{where}.content[{index}].text", "A 'text' content part needs a 'text' string.")
            chars += len(text) if isinstance(text, str) else _NON_TEXT_PART_CHARS
        return chars
    raise _invalid(f"{where}.content", f"'{where}.content' must be a string or an array of content parts.")


def _prompt_chars(prompt: object) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            return sum(len(item) for item in prompt)
        if all(_is_token_id(item) for item in prompt):
            return len(prompt) * CHARS_PER_TOKEN
        if all(isinstance(item, list) and item and all(_is_token_id(t) for t in item) for item in prompt):
            return sum(len(item) for item in prompt) * CHARS_PER_TOKEN
    raise _invalid("prompt", "'prompt' must be a string, an array of strings, or an array of token ids.")


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _invalid(param: str, message: str, *, code: str = "invalid_value") -> ApiError:
    return ApiError(422, message, param=param, code=code)
