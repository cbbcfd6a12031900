"""What litellm costs per request: the hosted client against a direct httpx call, on a zero-latency simulator.

    .venv/bin/python -m tests.hosted.overhead [--requests 300] [--concurrency 8]

Starts ``sim-hosted --ttft-ms 0 --tpot-ms 0`` on a free port (stopped by PID at the end) and reports,
for OpenAI's and Anthropic's wire formats, p50/p99 latency of sequential requests (non-streaming,
streaming to the last byte, streaming to the first chunk) and requests/s at the given concurrency.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from spillgate.backends.hosted import HostedCompletion, HostedModel, HostedStream
from spillgate.backends.hosted.client import complete
from tests.support.procs import free_port, start_spillgate

Call = Callable[[], Awaitable[None]]
MESSAGES = [{"role": "user", "content": "Summarise prefix caching in one line."}]


def _ms(samples: list[float], quantile: float) -> float:
    ordered = sorted(samples)
    return 1000 * ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


async def _measure(call: Call, requests: int, concurrency: int) -> tuple[float, float, float]:
    """(p50 ms, p99 ms) of sequential calls, then calls/s with ``concurrency`` in flight."""
    for _ in range(20):
        await call()
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return _ms(samples, 0.5), _ms(samples, 0.99), requests / (time.perf_counter() - started)


def _direct_calls(http: httpx.AsyncClient, url: str) -> dict[str, Call]:
    openai_headers = {"authorization": "Bearer sk-bench"}
    anthropic_headers = {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01"}
    chat = {"model": "m", "messages": MESSAGES, "max_tokens": 16}
    anthropic = {"model": "claude-sonnet-4-5", "messages": MESSAGES, "max_tokens": 16}

    async def post(path: str, body: dict[str, object], headers: dict[str, str]) -> None:
        response = await http.post(url + path, json=body, headers=headers)
        response.raise_for_status()
        response.json()

    async def stream(path: str, body: dict[str, object], headers: dict[str, str], first_only: bool = False) -> None:
        async with http.stream("POST", url + path, json={**body, "stream": True}, headers=headers) as response:
            async for line in response.aiter_lines():
                if first_only and "delta" in line:
                    break

    return {
        "openai direct (httpx)": lambda: post("/v1/chat/completions", chat, openai_headers),
        "openai direct (httpx) stream": lambda: stream("/v1/chat/completions", chat, openai_headers),
        "anthropic direct (httpx)": lambda: post("/v1/messages", anthropic, anthropic_headers),
        "anthropic direct (httpx) stream": lambda: stream("/v1/messages", anthropic, anthropic_headers),
        "openai direct (httpx) stream, first chunk": lambda: stream(
            "/v1/chat/completions", chat, openai_headers, first_only=True
        ),
        "anthropic direct (httpx) stream, first chunk": lambda: stream(
            "/v1/messages", anthropic, anthropic_headers, first_only=True
        ),
    }


def _hosted_calls(url: str, http: httpx.AsyncClient) -> dict[str, Call]:
    models = {
        "openai": HostedModel("o", "openai/frontier-large", api_base=url + "/v1", api_key="sk-bench"),
        "anthropic": HostedModel("a", "anthropic/claude-sonnet-4-5", api_base=url, api_key="sk-bench").with_price(),
    }
    body = {"model": "x", "messages": MESSAGES, "max_tokens": 16}

    def whole(model: HostedModel, direct: bool = False) -> Call:
        async def call() -> None:
            assert isinstance(await complete(model, body, http=http if direct else None), HostedCompletion)

        return call

    def streamed(model: HostedModel, first_only: bool = False, direct: bool = False) -> Call:
        async def call() -> None:
            result = await complete(model, {**body, "stream": True}, http=http if direct else None)
            assert isinstance(result, HostedStream)
            async for _ in result:
                if first_only:
                    await result.aclose()
                    break

        return call

    calls: dict[str, Call] = {}
    for name, model in models.items():
        calls[f"{name} via litellm (hosted client)"] = whole(model)
        calls[f"{name} via litellm (hosted client) stream"] = streamed(model)
        calls[f"{name} via litellm (hosted client) stream, first chunk"] = streamed(model, first_only=True)
    # What the gateway does for OpenAI-compatible providers (backends.hosted.direct).
    calls["openai without litellm (hosted client)"] = whole(models["openai"], direct=True)
    calls["openai without litellm (hosted client) stream"] = streamed(models["openai"], direct=True)
    calls["openai without litellm (hosted client) stream, first chunk"] = streamed(
        models["openai"], first_only=True, direct=True
    )
    return calls


async def _run(url: str, requests: int, concurrency: int) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        calls = {**_direct_calls(http, url), **_hosted_calls(url, http)}
        print(f"{'path':56} {'p50 ms':>8} {'p99 ms':>8} {'req/s @' + str(concurrency):>10}")
        for name, call in sorted(
            calls.items(), key=lambda item: (item[0].count("stream"), "first" in item[0], item[0])
        ):
            p50, p99, rate = await _measure(call, requests, concurrency)
            print(f"{name:56} {p50:8.2f} {p99:8.2f} {rate:10.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as logs:
        sim = start_spillgate(
            ["sim-hosted", "--port", str(port), "--ttft-ms", "0", "--tpot-ms", "0", "--jitter", "0"],
            port=port,
            log_dir=Path(logs),
        )
        try:
            asyncio.run(_run(sim.url, args.requests, args.concurrency))
        finally:
            sim.stop()


if __name__ == "__main__":
    main()
