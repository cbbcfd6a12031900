"""What a Messages request becomes on the chat path, and what Anthropic's cache prices come to: the parts of the
face that are pure functions, checked field by field (the gateway tests run them through the SDK)."""

from __future__ import annotations

import orjson
import pytest

from spillgate.backends.hosted import Price, PriceOverride
from spillgate.backends.hosted.pricing import CacheWritingPrice, price_for
from spillgate.gateway.control.config import LimitsConfig
from spillgate.gateway.errors import ApiError
from spillgate.gateway.faces.messages_answer import usage, whole_message
from spillgate.gateway.faces.messages_request import translate_request

LIMITS = LimitsConfig()


def chat_of(body: dict, *, caching: bool = True) -> dict:
    return translate_request(orjson.dumps(body), LIMITS, lambda model: caching).chat


def test_a_tool_conversation_becomes_chat_messages() -> None:
    tool = {"name": "f", "description": "d", "input_schema": {"type": "object"}}
    call = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]}
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "text", "text": "Calling."}, call]},
            {"role": "user", "content": [result, {"type": "text", "text": "and?"}]},
        ],
        "tools": [tool],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "top_k": 5,
        "metadata": {"user_id": "u-1"},
    }
    assert chat_of(body) == {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "Calling.",
                "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
            {"role": "user", "content": [{"type": "text", "text": "and?"}]},
        ],
        "stop": ["END"],
        "top_k": 5,
        "user": "u-1",
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "description": "d"}}
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }


def test_streaming_asks_for_the_usage_chunk_and_a_named_tool_is_forced() -> None:
    tool = {"name": "f", "input_schema": {"type": "object"}}
    chat = chat_of(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "tools": [tool],
            "tool_choice": {"type": "tool", "name": "f"},
        }
    )
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_cache_control_and_images_stay_on_their_parts() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    text = {"type": "text", "text": "t", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    chat = chat_of({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [image, text]}]})
    assert chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": "t", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
            ],
        }
    ]


def test_cache_control_is_dropped_where_no_anthropic_model_can_serve() -> None:
    control = {"cache_control": {"type": "ephemeral"}}
    system = [{"type": "text", "text": "s", **control}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "u", **control}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a", **control}]},
    ]
    chat = chat_of({"model": "m", "max_tokens": 1, "system": system, "messages": messages}, caching=False)
    assert chat["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "s"}]},
        {"role": "user", "content": [{"type": "text", "text": "u"}]},
        {"role": "assistant", "content": "a"},
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 1, "messages": []}, "messages"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": []}]}, "messages.0.content"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "thinking"}]}]}, "messages"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "thinking": {}}, "thinking"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "temperature"),
        (
            {"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": 7}},
            "metadata.user_id",
        ),
    ],
)
def test_bad_requests_are_400s_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat_of({"model": "m", **body})
    assert caught.value.status == 400 and caught.value.param == param


def test_usage_counts_input_as_anthropic_does() -> None:
    chat_usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 600, "cache_creation_tokens": 300},
    }
    assert usage(chat_usage) == {
        "input_tokens": 100,
        "output_tokens": 7,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 600,
    }


def test_a_tool_call_answer_is_a_tool_use_block() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}}
    chat = {"choices": [{"message": {"content": None, "tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    message = whole_message(chat, "route", ())
    assert message["content"] == [{"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": [1]}}]
    assert message["stop_reason"] == "tool_use" and message["model"] == "route"


def test_cache_writes_cost_more_than_input_and_reads_less() -> None:
    price = CacheWritingPrice(input=3e-6, output=15e-6, cached_input=0.3e-6, cache_write=3.75e-6)
    # 1000 prompt tokens: 600 read, 300 written, 100 neither.
    expected = 100 * 3e-6 + 600 * 0.3e-6 + 300 * 3.75e-6 + 10 * 15e-6
    assert price.cost(1000, 10, cached_tokens=600, cache_write_tokens=300) == pytest.approx(expected)
    plain = Price(input=2e-6, output=8e-6, cached_input=1e-6)
    assert plain.cost(1000, 0, 0, cache_write_tokens=300) == pytest.approx(1000 * 2e-6)  # no premium billed


def test_anthropic_models_default_to_anthropics_cache_ratios() -> None:
    sim = price_for("anthropic/claude-sim", PriceOverride(input_per_mtok=3.0, output_per_mtok=15.0))
    assert isinstance(sim, CacheWritingPrice)
    assert (sim.cached_input, sim.cache_write) == pytest.approx((0.3e-6, 3.75e-6))
    mapped = price_for("anthropic/claude-sonnet-4-5")
    assert isinstance(mapped, CacheWritingPrice) and mapped.cache_write == pytest.approx(1.25 * mapped.input)
    assert not isinstance(price_for("openai/gpt-4o"), CacheWritingPrice)


async def test_streamed_tool_arguments_that_are_not_an_object_arrive_as_raw() -> None:
    """Real SGLang, asked for a named tool without a strict schema, streamed a bare number as the arguments: the
    block's ``input`` must still be an object, as the whole answer gives it."""
    from spillgate.gateway.faces.messages_stream import MessagesStream

    stream = MessagesStream("chat", ())
    call = {"id": "call_1", "index": 0, "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "47"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "12"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    ]
    events = b"".join([await stream.chunk(chunk) for chunk in chunks]) + await stream.end(None)
    partial = [
        orjson.loads(line[6:])["delta"]["partial_json"]
        for line in events.split(b"\n")
        if line.startswith(b"data: ") and b"input_json_delta" in line
    ]
    assert orjson.loads("".join(partial)) == {"_raw": "4712"}
