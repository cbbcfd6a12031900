"""A stand-in SGLang replica that answers at once, so a benchmark measures only what sits in front of it.

Raw ``asyncio.Protocol`` + httptools on uvloop rather than a framework: it shares a core with the load
generator, and a slow stub would cap every row of the table at its own speed and hide the relay's cost.
Every response is prebuilt; a stream is 16 ``chat.completion.chunk`` events (plus a usage event when
``stream_options.include_usage`` is true) and ``[DONE]``, sent with chunked encoding, one write per event.

    python -m tests.bench.stub_backend --port 9000 [--model bench-model]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import httptools
import orjson
import uvloop

CHAT_PATH = b"/v1/chat/completions"
STREAM_EVENTS = 16
PROMPT_TOKENS = 42
CREATED = 1_700_000_000


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def _response(body: bytes, *, status: bytes = b"200 OK", content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        content_type,
        len(body),
        body,
    )


def _chunk(payload: bytes) -> bytes:
    """One chunk of chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(data: bytes) -> bytes:
    return _chunk(b"data: " + data + b"\n\n")


class Replies:
    """Every byte the stub can send, built once for the model name it serves."""

    def __init__(self, model: str, max_total_tokens: int) -> None:
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": STREAM_EVENTS,
            "total_tokens": PROMPT_TOKENS + STREAM_EVENTS,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        completion = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "A fixed answer from the benchmark stub."},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
        self.completion = _response(_dumps(completion))
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        self.stream_events = [_event(_dumps(self._stream_chunk(model, i))) for i in range(STREAM_EVENTS)]
        usage_chunk = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED}
        self.usage_event = _event(_dumps({**usage_chunk, "model": model, "choices": [], "usage": usage}))
        self.stream_end = _event(b"[DONE]") + b"0\r\n\r\n"
        metrics = "".join(
            f'# HELP sglang:{name} stub\n# TYPE sglang:{name} gauge\nsglang:{name}{{model_name="{model}"}} 0.0\n'
            for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate")
        )
        server_info = _dumps({"model_path": model, "max_total_num_tokens": max_total_tokens, "version": "bench-stub"})
        model_info = _dumps({"model_path": model, "tokenizer_path": model, "is_generation": True})
        self.static = {
            b"/health": _response(b"{}"),
            b"/get_server_info": _response(server_info),
            b"/server_info": _response(server_info),
            b"/get_model_info": _response(model_info),
            b"/model_info": _response(model_info),
            b"/v1/models": _response(_dumps({"object": "list", "data": [{"id": model, "object": "model"}]})),
            b"/metrics": _response(metrics.encode(), content_type=b"text/plain; version=0.0.4"),
        }
        self.not_found = _response(b'{"error":{"message":"not found"}}', status=b"404 Not Found")
        self.bad_request = _response(b'{"error":{"message":"invalid JSON body"}}', status=b"400 Bad Request")

    @staticmethod
    def _stream_chunk(model: str, index: int) -> dict[str, Any]:
        delta: dict[str, str] = {"content": f"tok{index} "}
        if index == 0:
            delta["role"] = "assistant"
        last = index == STREAM_EVENTS - 1
        return {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if last else None}],
        }


class StubProtocol(asyncio.Protocol):
    """One client connection; requests are answered in order, streams from a task."""

    replies: Replies
    last_chat_body: bytes = b"{}"
    """The last chat request as received, served on ``GET /bench/last_request`` so a benchmark can check what a
    gateway sent upstream (the rewritten ``model``, the added ``stream_options``)."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []
        self._streaming: asyncio.Future[None] | None = None  # held so the task is not garbage-collected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        transport = self._transport
        assert transport is not None
        path = self._url.split(b"?", 1)[0]
        body = b"".join(self._body)
        self._url = b""
        self._body = []
        keep_alive = self._parser.should_keep_alive()
        if path == CHAT_PATH and self._parser.get_method() == b"POST":
            self._chat(transport, body, keep_alive)
            return
        if path == b"/bench/last_request":
            transport.write(_response(StubProtocol.last_chat_body))
        else:
            transport.write(self.replies.static.get(path, self.replies.not_found))
        if not keep_alive:
            transport.close()

    def _chat(self, transport: asyncio.Transport, body: bytes, keep_alive: bool) -> None:
        StubProtocol.last_chat_body = body
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict):
            transport.write(self.replies.bad_request)
        elif payload.get("stream") is True:
            options = payload.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            self._streaming = asyncio.ensure_future(self._stream(transport, usage, keep_alive))
            return
        else:
            transport.write(self.replies.completion)
        if not keep_alive:
            transport.close()

    async def _stream(self, transport: asyncio.Transport, usage: bool, keep_alive: bool) -> None:
        """One write per event, yielding to the loop between them, as a token-by-token server would."""
        replies = self.replies
        transport.write(replies.stream_head)
        events = [*replies.stream_events, replies.usage_event] if usage else replies.stream_events
        for event in events:
            await asyncio.sleep(0)
            if transport.is_closing():
                return
            transport.write(event)
        await asyncio.sleep(0)
        if not transport.is_closing():
            transport.write(replies.stream_end)
            if not keep_alive:
                transport.close()


async def serve(host: str, port: int, model: str, max_total_tokens: int) -> None:
    StubProtocol.replies = Replies(model, max_total_tokens)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: stop.done() or stop.set_result(None))
    server = await loop.create_server(StubProtocol, host, port, backlog=4096, reuse_address=True)
    print(f"stub backend listening on http://{host}:{port} (model {model})", flush=True)
    try:
        await stop
    finally:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="bench-model", help="the model name it reports (a pool's served_model)")
    parser.add_argument("--max-total-tokens", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.host, args.port, args.model, args.max_total_tokens))


if __name__ == "__main__":
    main()
