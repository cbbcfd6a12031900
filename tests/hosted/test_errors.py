"""Provider failures reach the gateway as a few kinds, with Retry-After, the streamed flag and no secrets."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from spillgate.backends.hosted import HostedCompletion, HostedError, HostedModel, HostedStream
from tests.hosted.conftest import API_KEY, SIM_ARGS, STALL_TIMEOUT_S, ModelFor, complete, hosted_model
from tests.support.procs import free_port, start_spillgate


def chat(stream: bool, **fields: Any) -> dict[str, Any]:
    body = {"model": "frontier", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": stream}
    return {**body, **fields}


async def outcome(model: HostedModel, body: dict[str, Any]) -> tuple[HostedError | None, list[bytes]]:
    """The error a request ends with (None if it succeeds) and the bytes streamed before it."""
    received: list[bytes] = []
    try:
        result = await complete(model, body)
        if isinstance(result, HostedStream):
            async for item in result:
                received.append(item)
        else:
            assert isinstance(result, HostedCompletion)
    except HostedError as exc:
        return exc, received
    return None, received


async def test_429_and_500_are_reported_without_retries(tmp_path: Path, provider: str) -> None:
    """The simulator answers 1: ok, 2: 429, 3: 500, 4: 429; a retry inside litellm would shift the sequence."""
    # A simulator of its own, so no other request can have advanced its fault counter.
    port = free_port()
    faults = SIM_ARGS[f"faults-{provider.removesuffix('-direct')}"]
    fresh = start_spillgate(["sim-hosted", "--port", str(port), *faults], port=port, log_dir=tmp_path)
    try:
        await _check_fault_sequence(hosted_model(fresh.url, provider))
    finally:
        fresh.stop()


async def _check_fault_sequence(model: HostedModel) -> None:
    first, _ = await outcome(model, chat(False))
    assert first is None
    limited, _ = await outcome(model, chat(True))
    assert limited is not None and limited.kind == "rate_limited" and limited.status == 429
    assert limited.retry_after_s == 1.0 and not limited.streamed_anything
    assert "rate limit" in limited.message.lower()
    failed, _ = await outcome(model, chat(False))
    assert failed is not None and failed.kind == "server_error" and failed.status == 500
    assert failed.retry_after_s is None


async def test_silence_mid_stream_is_a_timeout_after_something_was_streamed(model_for: ModelFor) -> None:
    model = model_for("stall", timeout_s=STALL_TIMEOUT_S)
    started = time.perf_counter()
    error, received = await outcome(model, chat(True))
    assert error is not None and error.kind == "timeout", error
    assert error.streamed_anything and received
    assert time.perf_counter() - started < STALL_TIMEOUT_S + 3


async def test_silence_before_a_whole_answer_is_a_timeout(model_for: ModelFor) -> None:
    error, received = await outcome(model_for("stall", timeout_s=STALL_TIMEOUT_S), chat(False))
    assert error is not None and error.kind == "timeout" and not error.streamed_anything and not received


async def test_a_broken_stream_is_malformed_after_something_was_streamed(model_for: ModelFor) -> None:
    error, received = await outcome(model_for("malformed"), chat(True))
    assert error is not None and error.kind == "malformed", error
    assert error.streamed_anything and len(received) >= 2


async def test_a_broken_body_is_malformed(model_for: ModelFor) -> None:
    error, _ = await outcome(model_for("malformed"), chat(False))
    assert error is not None and error.kind == "malformed" and not error.streamed_anything


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refused_connection_is_connect(provider: str, stream: bool) -> None:
    model = hosted_model(f"http://127.0.0.1:{free_port()}", provider)  # nothing listens there
    error, _ = await outcome(model, chat(stream))
    assert error is not None and error.kind == "connect" and not error.streamed_anything


@pytest.mark.parametrize("stream", [False, True])
async def test_a_rejected_request_is_bad_request_with_the_providers_message(model_for: ModelFor, stream: bool) -> None:
    error, _ = await outcome(model_for("fast"), chat(stream, max_tokens=-5))
    assert error is not None and error.kind == "bad_request" and error.status == 400
    assert "max_tokens" in error.message and not error.streamed_anything


async def test_the_key_never_reaches_logs_or_error_messages(
    model_for: ModelFor, caplog: pytest.LogCaptureFixture
) -> None:
    """Every log record (litellm's included, at DEBUG) and every error message, over successes and failures."""
    caplog.set_level(logging.DEBUG)
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        caplog.set_level(logging.DEBUG, logger=name)
    texts: list[str] = []
    for sim, stream in (("fast", False), ("fast", True), ("malformed", True), ("malformed", False)):
        error, _ = await outcome(model_for(sim, timeout_s=STALL_TIMEOUT_S), chat(stream))
        if error is not None:
            texts += [str(error), repr(error), error.message]
    error, _ = await outcome(model_for("fast"), chat(False, max_tokens=-5))
    assert error is not None
    texts += [str(error), error.message]
    texts.append(repr(model_for("fast")))
    assert len(caplog.records) > 10  # litellm really logged at DEBUG
    logged = [record.getMessage() for record in caplog.records] + [caplog.text]
    leaks = [text for text in texts + logged if API_KEY in text or API_KEY[8:] in text]
    assert not leaks


async def test_a_gateway_error_page_is_server_error_not_malformed(provider: str) -> None:
    """A 502 with an HTML body (a proxy in front of the provider) must not look like a broken response."""
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/html\r\nconnection: close\r\n"
        writer.write(head + b"content-length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        for stream in (False, True):
            error, _ = await outcome(hosted_model(url, provider), chat(stream))
            assert error is not None and error.kind == "server_error" and error.status == 502
    finally:
        server.close()
        await server.wait_closed()
