"""A replica stand-in that calls a function: for the Responses tests, while the simulator generates only text.

``python -m tests.faces.responses_tool_replica --port N``: probes answer as a healthy SGLang's do; a chat request
that offers tools and ends with the user's message gets a call of the first tool (``{"city": "Paris"}``), anything
else a short text answer. Whole or streamed (the call's arguments in two pieces, then a usage chunk when asked).
A user message that asks to "think" gets reasoning first (``reasoning_content``, as SGLang's reasoning parser sends it).
``GET /received`` lists the chat bodies it was sent, so a test sees exactly what the gateway sent.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

_METRICS = "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage 0\nsglang:prompt_tokens_total 0\n"
ARGUMENTS = '{"city": "Paris"}'
TEXT = "It is sunny in Paris."
THOUGHT = "The user wants the weather."
USAGE = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}


def build() -> Starlette:
    received: list[dict[str, Any]] = []

    async def ok(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(_METRICS)

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "sim-model", "object": "model"}]})

    async def seen(_: Request) -> Response:
        return JSONResponse(received)

    async def complete(request: Request) -> Response:
        body = await request.json()
        received.append(body)
        messages = body.get("messages") or [{}]
        name = (
            body["tools"][0]["function"]["name"] if body.get("tools") and messages[-1].get("role") == "user" else None
        )
        think = "think" in str(messages[-1].get("content"))
        if body.get("stream"):
            include_usage = (body.get("stream_options") or {}).get("include_usage", False)
            return StreamingResponse(_events(name, include_usage, think), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": TEXT if name is None else None}
        message["reasoning_content"] = THOUGHT if think else None
        if name is not None:
            message["tool_calls"] = [_call(name, ARGUMENTS)]
        choice = {"index": 0, "message": message, "finish_reason": "stop" if name is None else "tool_calls"}
        return JSONResponse(_completion({"choices": [choice], "usage": USAGE}))

    routes = [Route(path, ok) for path in ("/ready", "/health")]
    routes += [Route("/metrics", metrics), Route("/v1/models", models), Route("/received", seen)]
    routes += [Route("/v1/chat/completions", complete, methods=["POST"])]
    return Starlette(routes=routes)


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "call_weather_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def _completion(fields: dict[str, Any], kind: str = "chat.completion") -> dict[str, Any]:
    return {"id": "chatcmpl-tool", "object": kind, "created": 1, "model": "sim-model", **fields}


async def _events(name: str | None, include_usage: bool, think: bool) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + orjson.dumps(_completion({"choices": [choice]}, "chat.completion.chunk")) + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    if think:
        for word in THOUGHT.split(" "):
            yield chunk({"content": None, "reasoning_content": word + " "})
    if name is None:
        for word in TEXT.split(" "):
            yield chunk({"content": word + " "})
        yield chunk({}, "stop")
    else:
        call = _call(name, "")
        yield chunk({"tool_calls": [{"index": 0, **call}]})
        for piece in (ARGUMENTS[:9], ARGUMENTS[9:]):
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls")
    if include_usage:
        yield b"data: " + orjson.dumps(_completion({"choices": [], "usage": USAGE}, "chat.completion.chunk")) + b"\n\n"
    yield b"data: [DONE]\n\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
