"""The client's SSE reading: events split anywhere across reads, usage, errors, a missing [DONE]."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from spillgate.gateway.bench.client import RequestResult, _read_stream, api_paths


def event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(content: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": content}}]})


USAGE = event(
    {
        "choices": [],
        "usage": {"prompt_tokens": 50, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}},
    }
)


async def pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


async def read(body: bytes, size: int = 7, keep_reply: bool = True) -> RequestResult:
    result = RequestResult(start=0.0)
    await _read_stream(pieces(body, size), result, sent=0.0, keep_reply=keep_reply)
    return result


async def test_events_split_across_reads() -> None:
    body = event({"choices": [{"delta": {"role": "assistant"}}]}) + chunk("a b") + chunk(" c") + chunk(".")
    body += USAGE + b"data: [DONE]\n\n"
    for size in (1, 5, 64, len(body)):
        result = await read(body, size)
        assert result.error is None
        assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (50, 3, 32)
        assert result.reply == "a b c."
        assert result.ttft is not None and result.tpot is not None and result.tpot >= 0


async def test_crlf_events_and_no_usage() -> None:
    body = (chunk("x") + chunk("y") + b"data: [DONE]\n\n").replace(b"\n", b"\r\n")
    result = await read(body, keep_reply=False)
    assert result.error is None and result.completion_tokens == 2, "without usage, one token per content chunk"
    assert result.reply is None


async def test_error_event_and_missing_done() -> None:
    failed = await read(chunk("x") + event({"error": {"message": "out of memory", "code": 500}}))
    assert failed.error == "stream_error" and failed.detail == "out of memory"
    cut = await read(chunk("x") + chunk("y"))
    assert cut.error == "incomplete"


def test_api_paths_accept_v1_or_not() -> None:
    assert api_paths("http://h:1") == ("http://h:1", "/v1/chat/completions")
    assert api_paths("http://h:1/v1/") == ("http://h:1", "/v1/chat/completions")
