"""The real litellm HTTP path against the simulated provider, in OpenAI's and Anthropic's wire formats."""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson
import pytest

from spillgate.backends.hosted import HostedCompletion, HostedModel, HostedStream
from spillgate.backends.hosted.client import OPENAI_REQUEST_FIELDS, request_arguments
from tests.hosted.conftest import SLOW_TPOT_MS, ModelFor, complete


def chat(content: str = "Tell me about prefix caches.", **fields: Any) -> dict[str, Any]:
    return {"model": "frontier", "messages": [{"role": "user", "content": content}], "max_tokens": 6, **fields}


def events(raw: list[bytes]) -> list[dict[str, Any]]:
    """The JSON events of an SSE stream; asserts the framing (one event per item, [DONE] last)."""
    assert raw[-1] == b"data: [DONE]\n\n"
    assert all(item.startswith(b"data: ") and item.endswith(b"\n\n") and item.count(b"\n\n") == 1 for item in raw)
    return [orjson.loads(item[len(b"data: ") :]) for item in raw[:-1]]


async def test_non_streaming_body_usage_and_cost(model_for: ModelFor) -> None:
    model = model_for("fast")
    result = await complete(model, chat())
    assert isinstance(result, HostedCompletion)
    body = orjson.loads(result.body)
    assert body["object"] == "chat.completion" and body["id"]
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert result.usage is not None and result.usage.completion_tokens == 6 and result.usage.prompt_tokens > 10
    assert body["usage"]["prompt_tokens"] == result.usage.prompt_tokens
    assert model.price is not None
    expected = result.usage.prompt_tokens * model.price.input + 6 * model.price.output
    assert result.cost_usd == pytest.approx(expected)


async def test_streaming_relays_openai_events_with_usage(model_for: ModelFor) -> None:
    model = model_for("fast")
    whole = await complete(model, chat())
    stream = await complete(model, chat(stream=True, stream_options={"include_usage": True}))
    assert isinstance(stream, HostedStream) and isinstance(whole, HostedCompletion)
    parsed = events([item async for item in stream])
    assert {event["object"] for event in parsed} == {"chat.completion.chunk"}
    text = "".join(choice["delta"].get("content", "") for event in parsed for choice in event["choices"])
    assert text == orjson.loads(whole.body)["choices"][0]["message"]["content"]  # same reply either way
    finishes = [choice["finish_reason"] for event in parsed for choice in event["choices"] if choice["finish_reason"]]
    assert finishes == ["length"]
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 6
    assert stream.usage == whole.usage and stream.cost_usd == pytest.approx(whole.cost_usd)
    assert stream.streamed_anything and stream.finish_reason == "length"


async def test_usage_is_kept_but_not_relayed_unless_asked(model_for: ModelFor) -> None:
    stream = await complete(model_for("fast"), chat(stream=True))
    assert isinstance(stream, HostedStream)
    parsed = events([item async for item in stream])
    assert all("usage" not in event and event["choices"] for event in parsed)
    assert stream.usage is not None and stream.usage.completion_tokens == 6 and stream.cost_usd


async def test_chunks_arrive_as_they_are_generated(model_for: ModelFor) -> None:
    """With a 250 ms TPOT, each token must reach the caller about one TPOT after the previous one."""
    stream = await complete(model_for("slow"), chat(max_tokens=4, stream=True))
    assert isinstance(stream, HostedStream)
    arrivals: list[float] = []
    async for item in stream:
        if b'"content":"' in item and b'"content":""' not in item:
            arrivals.append(time.perf_counter())
    assert len(arrivals) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert min(gaps) > 0.5 * SLOW_TPOT_MS / 1000, gaps  # not buffered and released together
    assert arrivals[-1] - arrivals[0] > 2 * SLOW_TPOT_MS / 1000


async def test_cached_prompt_tokens_are_reported_and_priced(model_for: ModelFor, provider: str) -> None:
    model = model_for("fast")
    clauses = " ".join(f"clause {i} of the shared system prompt." for i in range(200))  # ~2,400 tokens
    long_prompt = f"For {provider}: {clauses}"  # the simulator is shared by every provider's tests
    first = await complete(model, chat(long_prompt + " First question?"))
    second = await complete(model, chat(long_prompt + " Second question?"))
    assert isinstance(first, HostedCompletion) and isinstance(second, HostedCompletion)
    assert first.usage is not None and second.usage is not None and model.price is not None
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens >= 1024 and second.usage.cached_tokens % 128 == 0
    assert second.usage.prompt_tokens > second.usage.cached_tokens  # cached tokens are part of the prompt
    usage, price = second.usage, model.price
    uncached = usage.prompt_tokens - usage.cached_tokens
    expected = (
        uncached * price.input + usage.cached_tokens * price.cached_input + usage.completion_tokens * price.output
    )
    assert second.cost_usd == pytest.approx(expected)
    assert orjson.loads(second.body)["usage"]["prompt_tokens_details"]["cached_tokens"] == usage.cached_tokens


async def test_the_client_cannot_steer_litellm(model_for: ModelFor) -> None:
    """Only OpenAI fields pass: a client's api_base, api_key or mock_response never reach litellm."""
    steering = {
        "api_base": "http://127.0.0.1:9/v1",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "sk-client-supplied",
        "mock_response": "mocked!",
        "extra_headers": {"x-api-key": "sk-client-supplied"},
    }
    result = await complete(model_for("fast"), chat(**steering))
    assert isinstance(result, HostedCompletion)
    content = orjson.loads(result.body)["choices"][0]["message"]["content"]
    assert content and content != "mocked!"


async def test_closing_a_stream_mid_way_ends_it_at_once(model_for: ModelFor) -> None:
    """What the gateway does when its client goes away: the upstream stream is closed, not drained."""
    stream = await complete(model_for("slow"), chat(max_tokens=40, stream=True))
    assert isinstance(stream, HostedStream)
    first = await anext(aiter(stream))
    assert first.startswith(b"data: ")
    started = time.perf_counter()
    await stream.aclose()
    assert time.perf_counter() - started < SLOW_TPOT_MS / 1000
    assert [item async for item in stream] == []
    assert stream.streamed_anything and stream.usage is None


def test_request_arguments_take_only_openai_fields_from_the_client() -> None:
    model = HostedModel("m", "anthropic/claude-sonnet-4-5", api_base="http://127.0.0.1:1", api_key="sk-config")
    body = chat(stream=True, api_key="sk-client", api_base="http://evil", metadata={"a": 1}, temperature=0.2)
    arguments = request_arguments(model, body)
    assert arguments["api_key"] == "sk-config" and arguments["api_base"] == "http://127.0.0.1:1"
    assert arguments["model"] == "anthropic/claude-sonnet-4-5" and arguments["temperature"] == 0.2
    assert arguments["num_retries"] == 0 and arguments["max_retries"] == 0
    assert arguments["stream_options"] == {"include_usage": True}
    fixed = {"model", "api_base", "api_key", "stream", "timeout", "num_retries", "max_retries", "drop_params"}
    assert set(arguments) <= OPENAI_REQUEST_FIELDS | fixed | {"stream_options"}
