"""An OpenAI-compatible provider stand-in that loses the keep-alive race on purpose.

``python -m tests.gateway.stale_keepalive_provider --port N``: each connection answers its first
``POST .../chat/completions`` with a whole ``chat.completion`` and keeps the connection open, then closes it,
without a byte of answer, when the next request arrives on it. That is what a server whose idle timeout fires
just as a client reuses the connection looks like from the client, made deterministic. Any other request
(``GET /ready``) gets a 200 and the connection is closed.
"""

from __future__ import annotations

import argparse
import asyncio

import orjson

_COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-stale",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    answered = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            length = next(
                (int(v) for k, _, v in (line.partition(":") for line in lines) if k.lower() == "content-length"), 0
            )
            await reader.readexactly(length)
            if not request_line.startswith("POST ") or "chat/completions" not in request_line:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                break
            if answered:
                break  # the idle timeout "fired": close with no answer
            answered += 1
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
                + f"content-length: {len(_COMPLETION)}\r\n\r\n".encode()
                + _COMPLETION
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(_main(parser.parse_args().port))


if __name__ == "__main__":
    main()
