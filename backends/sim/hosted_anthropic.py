"""Anthropic's Messages API on the hosted-model simulator, so litellm's ``anthropic/`` path runs for real.

Shapes follow Anthropic's Messages API as litellm's Anthropic handler parses it
(``litellm/llms/anthropic/chat/handler.py``): ``x-api-key`` and ``anthropic-version`` headers; a
``message`` body with text content blocks and ``usage``; and the streaming event sequence
``message_start``, ``content_block_start``, ``ping``, ``content_block_delta`` (``text_delta``) ...,
``content_block_stop``, ``message_delta`` (``stop_reason``, cumulative ``usage.output_tokens``),
``message_stop``, each as ``event: NAME`` + ``data: JSON``. Errors are ``{"type": "error", "error":
{"type", "message"}}``.

Tools: with ``tools`` and a ``tool_choice`` of ``any`` or ``tool`` the answer is a ``tool_use`` block; with
``auto`` (or none) too, unless the last turn carries a ``tool_result`` (then the answer is text), so a client's
tool round trip runs end to end. The tool's ``input`` fills each property of its ``input_schema`` from the
generated text; streamed, it arrives as ``input_json_delta`` events.

Prompt caching: prefixes of long prompts are read from the cache as today (``cache_read_input_tokens``); a
request that marks a block with ``cache_control`` also writes the rest of its full cache blocks, reported as
``cache_creation_input_tokens``, and ``input_tokens`` counts only what was neither read nor written, as Anthropic
counts it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import StreamingResponse

from spillgate.backends.sim.generation import OutputPlan
from spillgate.backends.sim.hosted_cache import BLOCK_TOKENS
from spillgate.backends.sim.hosted_faults import Fault
from spillgate.backends.sim.hosted_model import SimHostedModel, key_accepted
from spillgate.backends.sim.wire import OrjsonResponse

# A content_block_delta cut off mid-JSON: what a broken proxy or a truncated write looks like.
MALFORMED_EVENT = b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {"te\n\n'
MALFORMED_BODY = b'{"id": "msg_broken", "type": "message", "content": [{"type": "te'


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(_Body):
    model: str = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


def _error(status: int, err_type: str, message: str, headers: dict[str, str] | None = None) -> OrjsonResponse:
    body = {"type": "error", "error": {"type": err_type, "message": message}}
    return OrjsonResponse(body, status_code=status, headers={"request-id": _request_id(), **(headers or {})})


def _fault_response(fault: Fault, retry_after_s: int) -> OrjsonResponse | None:
    """The error Anthropic answers for an injected 429 or 500, or None for no error status."""
    if fault.status == 429:
        message = "Number of request tokens has exceeded your per-minute rate limit (simulated)."
        return _error(429, "rate_limit_error", message, {"retry-after": str(retry_after_s)})
    if fault.status is not None:
        return _error(fault.status, "api_error", "Internal server error")
    return None


def _request_id() -> str:
    return f"req_sim{uuid.uuid4().hex[:20]}"


def _block_text(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "tool_use":
        return orjson.dumps({"name": block.get("name"), "parameters": block.get("input")}).decode()
    if kind == "tool_result":
        return _text(block.get("content") or "")
    return f"<{kind}>" if kind in ("image", "document") else ""


def _text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(_block_text(block) for block in content)


def _chat_messages(body: MessagesRequest) -> list[dict[str, str]]:
    """The conversation as the simulator's chat template reads it (system first)."""
    messages = [{"role": "system", "content": _text(body.system)}] if body.system else []
    return messages + [{"role": message.role, "content": _text(message.content)} for message in body.messages]


def _stop_reason(plan: OutputPlan) -> str:
    return "end_turn" if plan.stops else "max_tokens"


def _called_tool(body: MessagesRequest) -> dict[str, Any] | None:
    """The tool the simulated model calls, or None for a text answer."""
    tools = [tool for tool in body.tools or () if isinstance(tool.get("name"), str)]
    choice = (body.tool_choice or {}).get("type", "auto")
    if not tools or choice == "none":
        return None
    if choice == "tool":
        name = (body.tool_choice or {}).get("name")
        return next((tool for tool in tools if tool["name"] == name), None)
    if choice == "auto":
        last = body.messages[-1].content
        if isinstance(last, list) and any(block.get("type") == "tool_result" for block in last):
            return None  # the tool answered: the model answers in text
    return tools[0]


def _tool_input(tool: dict[str, Any], text: str) -> dict[str, Any]:
    """A value of each property's type in the tool's ``input_schema``: strings are the generated text."""
    schema = tool.get("input_schema") or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    values: dict[str, Any] = {}
    for name, spec in (properties or {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
            values[name] = spec["enum"][0]
        elif kind in ("integer", "number"):
            values[name] = len(text) % 100
        elif kind == "boolean":
            values[name] = True
        elif kind == "array":
            values[name] = []
        elif kind == "object":
            values[name] = {}
        else:
            values[name] = text.strip() or "sim"
    return values


def _tool_use_id() -> str:
    return f"toolu_sim{uuid.uuid4().hex[:20]}"


def _asks_caching(body: MessagesRequest) -> bool:
    """Whether any block (system, tools, messages) carries ``cache_control``."""
    blocks: list[Any] = list(body.system) if isinstance(body.system, list) else []
    blocks += body.tools or []
    for message in body.messages:
        if isinstance(message.content, list):
            blocks += message.content
    return any(isinstance(block, dict) and block.get("cache_control") for block in blocks)


def _prompt_usage(model: SimHostedModel, prompt_ids: list[int], caching: bool) -> dict[str, int]:
    """Anthropic's input counts: read from the cache, written to it (only when asked), and the rest."""
    read = model.cache.match_and_insert(prompt_ids)
    written = 0
    if caching and len(prompt_ids) >= model.config.prompt_cache_min_tokens:
        written = max(len(prompt_ids) // BLOCK_TOKENS * BLOCK_TOKENS - read, 0)
    return {
        "input_tokens": len(prompt_ids) - read - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def _event(payload: dict[str, Any]) -> bytes:
    """One server-sent event, named after its payload's ``type`` as Anthropic names them."""
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _check_headers(request: Request, model: SimHostedModel) -> OrjsonResponse | None:
    key = request.headers.get("x-api-key", "")
    if not key.strip():
        return _error(401, "authentication_error", "x-api-key header is required")
    if not key_accepted(key, model.config):
        return _error(401, "authentication_error", "invalid x-api-key")
    if not request.headers.get("anthropic-version"):
        return _error(400, "invalid_request_error", "anthropic-version: header is required")
    return None


def _parse(raw: bytes) -> MessagesRequest | OrjsonResponse:
    try:
        return MessagesRequest.model_validate(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return _error(400, "invalid_request_error", "The request body is not valid JSON.")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        return _error(400, "invalid_request_error", problems)


def add_anthropic_routes(app: FastAPI, model: SimHostedModel) -> None:
    """``POST /v1/messages`` on the simulator's app."""

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        rejected = _check_headers(request, model)
        if rejected is not None:
            return rejected
        body = _parse(await request.body())
        if isinstance(body, OrjsonResponse):
            return body
        fault = model.faults.next()
        failed = _fault_response(fault, model.config.faults.retry_after_s)
        if failed is not None:
            return failed
        prompt_ids = model.template.render(_chat_messages(body), body.tools)
        usage_in = _prompt_usage(model, prompt_ids, _asks_caching(body))
        seed, plan = model.plan(prompt_ids, body.max_tokens, None)
        tool = _called_tool(body)
        stop_reason = "tool_use" if tool is not None else _stop_reason(plan)
        head = {"id": f"msg_sim{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": body.model}
        headers = {"request-id": _request_id()}

        if not body.stream:
            ids = [token async for token in model.tokens(seed, plan, fault.cut_after)]
            if fault.cut_after is not None:
                if fault.stall:
                    await model.stall()
                    return _error(500, "api_error", "Internal server error")
                return Response(MALFORMED_BODY, media_type="application/json", headers=headers)
            text = model.tokenizer.decode(ids)
            if tool is not None:
                call = {
                    "type": "tool_use",
                    "id": _tool_use_id(),
                    "name": tool["name"],
                    "input": _tool_input(tool, text),
                }
                content = [call]
            else:
                content = [{"type": "text", "text": text}]
            message = {
                **head,
                "content": content,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {**usage_in, "output_tokens": len(ids)},
            }
            return OrjsonResponse(message, headers=headers)

        async def events() -> AsyncIterator[bytes]:
            usage = {**usage_in, "output_tokens": 1}
            start = {**head, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
            yield _event({"type": "message_start", "message": start})
            if tool is not None:
                block = {"type": "tool_use", "id": _tool_use_id(), "name": tool["name"], "input": {}}
            else:
                block = {"type": "text", "text": ""}
            yield _event({"type": "content_block_start", "index": 0, "content_block": block})
            yield _event({"type": "ping"})
            produced = 0
            ids: list[int] = []
            async for token in model.tokens(seed, plan, fault.cut_after):
                produced += 1
                ids.append(token)
                text = model.tokenizer.decode([token])
                if text and tool is None:
                    delta = {"type": "text_delta", "text": text}
                    yield _event({"type": "content_block_delta", "index": 0, "delta": delta})
            if tool is not None and fault.cut_after is None:
                arguments = orjson.dumps(_tool_input(tool, model.tokenizer.decode(ids))).decode()
                half = len(arguments) // 2
                for piece in (arguments[:half], arguments[half:]):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    yield _event({"type": "content_block_delta", "index": 0, "delta": delta})
            if fault.cut_after is not None:
                if fault.stall:
                    await model.stall()
                else:
                    yield MALFORMED_EVENT
                return
            yield _event({"type": "content_block_stop", "index": 0})
            delta = {"stop_reason": stop_reason, "stop_sequence": None}
            yield _event({"type": "message_delta", "delta": delta, "usage": {"output_tokens": produced}})
            yield _event({"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
