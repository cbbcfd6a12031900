"""A replica stand-in that passes every probe and fails every request, one way per ``--mode``.

``python -m tests.gateway.lying_replica --port N --mode MODE``: ``/ready``, ``/health``, ``/metrics`` (SGLang's
load lines) and ``/v1/models`` answer as a healthy SGLang would; a completion request gets:

- ``garbage``: a 200 whose body is not JSON, or a stream whose first event is not JSON;
- ``broken_midstream``: a proper first stream event, then one that is not JSON (a whole answer as ``garbage``);
- ``hang``: nothing at all, the request held open;
- ``echo_key``: a 400 in SGLang's shape whose message repeats the Authorization header it was sent.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

_METRICS = "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\nsglang:token_usage 0\nsglang:prompt_tokens_total 0\n"
_FIRST_EVENT = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}\n\n'


def build(mode: str) -> Starlette:
    async def ok(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(_METRICS)

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "sim-model", "object": "model"}]})

    async def complete(request: Request) -> Response:
        body = await request.json()
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "echo_key":
            key = request.headers.get("authorization", "")
            return JSONResponse({"object": "error", "message": f"bad request; your key was {key}"}, status_code=400)
        if not body.get("stream"):
            return PlainTextResponse("<html>upstream says hi</html>", status_code=200)
        return StreamingResponse(_events(mode), media_type="text/event-stream")

    routes = [Route(path, ok) for path in ("/ready", "/health")]
    routes += [Route("/metrics", metrics), Route("/v1/models", models)]
    routes += [Route(path, complete, methods=["POST"]) for path in ("/v1/chat/completions", "/v1/completions")]
    return Starlette(routes=routes)


async def _events(mode: str) -> AsyncIterator[bytes]:
    if mode == "broken_midstream":
        yield _FIRST_EVENT
        await asyncio.sleep(0.05)
    yield b"data: {this is not json\n\n"
    yield b"data: [DONE]\n\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=("garbage", "broken_midstream", "hang", "echo_key"), required=True)
    args = parser.parse_args()
    uvicorn.run(build(args.mode), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
