"""The gateway's Responses (``/v1/responses``) and Messages (``/v1/messages``) faces over a real SGLang and a real
vLLM replica, through the official ``openai`` and ``anthropic`` SDKs, every answer parsed with warnings as errors.

The faces turn each request into a chat-completions request and the engine's chat answer back into the face's
shape; here that answer comes from the engine itself (its usage, its cached-token report, its finish reasons,
its streaming chunks), not from the simulator. The tiny model's weights are random, so no test reads its text:
only the shape of the answer, its usage, and the finish reason, which must agree with the token count.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.engines.worlds import World, make_world
from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway
from tests.support.procs import RunningProcess

pytestmark = pytest.mark.engines

TOOL_PARSER = {
    "sglang": ("--tool-call-parser", "llama3"),
    "vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic"),
}
"""What each engine needs to take ``tools`` at all, added to the one replica each engine starts (they change nothing
for a request without tools). vLLM refuses ``llama3_json`` for the tiny tokenizer, which lacks Llama's
``<|python_tag|>``; ``pythonic`` needs no special token, and a forced call (``required``, a named tool) is written
by vLLM's own JSON grammar and read without the parser anyway."""


PATIENT_HEALTH = {"interval_s": 0.5, "timeout_s": 10.0, "unhealthy_after": 3, "generation_check_s": 0}
"""On two shared cores a busy engine can answer its probe late; these tests are not about ejection."""

LIMIT = 8
"""Output tokens asked for: the random model rarely ends a reply sooner, so most answers stop at the limit."""

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
"""A tool whose arguments a grammar can only write one of two ways: the best chance a random model has of
finishing a call within its token limit."""


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield from make_world(request.param)


@pytest.fixture(scope="module")
def gateway(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """One replica of the engine with the flags the README recommends (so it reports cached tokens) and its tool
    parser, behind a gateway whose route ``chat`` is that replica."""
    log_dir = tmp_path_factory.mktemp(f"{world.name}-faces")
    replica = world.replica(log_dir, *world.recommended, *TOOL_PARSER[world.engine])
    config = gateway_config([])
    config["pools"] = [world.pool([replica.url])]
    config["health"] = PATIENT_HEALTH
    proc = start_gateway(config, log_dir)
    yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def no_sdk_warnings() -> Iterator[None]:
    """Whatever the SDKs parse or serialise must match their models: any warning fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture(scope="module")
def sdk(gateway: RunningProcess) -> Iterator[openai.OpenAI]:
    """One client per gateway, closed with it: a client left to the garbage collector warns mid-test."""
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0, timeout=180) as client:
        yield client


@pytest.fixture(scope="module")
def claude(gateway: RunningProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0, timeout=180) as client:
        yield client


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


def assert_finished_as_counted(response: Any, limit: int) -> None:
    """A response is ``incomplete`` for ``max_output_tokens`` only when it used them all, else ``completed`` (the
    model may also end its turn on the last token it was allowed)."""
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= limit
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    if response.status == "incomplete":
        assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
        assert usage.output_tokens == limit
    else:
        assert response.status == "completed" and response.incomplete_details is None


def assert_stopped_as_counted(message: anthropic.types.Message, limit: int) -> None:
    """``max_tokens`` only when the message used them all; ``end_turn`` when the model ended it."""
    assert 0 < message.usage.output_tokens <= limit
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.stop_reason == "end_turn" or message.usage.output_tokens == limit


def test_a_plain_response(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="chat", input="Name a colour.", max_output_tokens=LIMIT)
    assert response.id.startswith("resp_") and response.object == "response" and response.model
    assert isinstance(response.output_text, str)
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert [part.type for part in message.content] == ["output_text"]
    assert_finished_as_counted(response, LIMIT)
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens >= 0
    response.model_dump_json()  # serialising warns on any field of the wrong type


def test_a_response_the_engine_ends_itself_is_completed(sdk: openai.OpenAI) -> None:
    """A JSON schema with one possible answer: the engine's grammar writes it and then only the end of the turn,
    so the reply ends before the limit whatever the weights, and the response is ``completed``."""
    only = {"type": "json_schema", "name": "answer", "schema": {"type": "string", "enum": ["yes"]}, "strict": True}
    whole = sdk.responses.create(model="chat", input="Yes?", max_output_tokens=64, text={"format": only})
    assert whole.status == "completed" and whole.incomplete_details is None, whole
    assert whole.usage is not None and 0 < whole.usage.output_tokens < 64
    events = list(
        sdk.responses.create(model="chat", input="Yes?", max_output_tokens=64, text={"format": only}, stream=True)
    )
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "completed" and events[-1].response.output_text == whole.output_text


def test_a_streamed_response(sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model="chat", input="Tell me a story.", max_output_tokens=LIMIT, stream=True))
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    assert types[-1] == f"response.{final.status}" and final.status in ("completed", "incomplete")
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert final.output_text == "".join(deltas)
    assert_finished_as_counted(final, LIMIT)
    final.model_dump_json()


def test_a_chained_response_sends_the_first_turn_and_reuses_its_cache(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="chat", input=words("cats", 400), max_output_tokens=LIMIT)
    second = sdk.responses.create(
        model="chat", previous_response_id=first.id, input="And dogs?", max_output_tokens=LIMIT
    )
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # The recommended flags make both engines report cached tokens: the second prompt starts with the first.
    assert first.usage.input_tokens_details.cached_tokens < first.usage.input_tokens / 2
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens / 2
    assert_finished_as_counted(second, LIMIT)


def test_a_plain_message(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model="chat", max_tokens=LIMIT, messages=[{"role": "user", "content": "Name a colour."}]
    )
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "chat" and [block.type for block in message.content] == ["text"]
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= LIMIT
    assert_stopped_as_counted(message, LIMIT)
    message.to_json()  # pydantic warns only when it serialises a field of the wrong type


def test_a_streamed_message(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="chat", max_tokens=LIMIT, messages=[{"role": "user", "content": "Tell me a story."}]
    ) as stream:
        events = list(stream)
        message = stream.get_final_message()
    names = [event.type for event in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    text = "".join(event.delta.text for event in events if event.type == "content_block_delta")
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == text
    assert 0 < message.usage.output_tokens <= LIMIT
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 0
    assert_stopped_as_counted(message, LIMIT)
    message.to_json()


TOOL_LIMIT = 48


def test_a_forced_tool_call_through_responses(sdk: openai.OpenAI) -> None:
    """``tool_choice: required`` makes the engine's grammar write a call; the random model may still run out of
    tokens inside it, so a call is checked only where the engine parsed one."""
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS, "strict": True}
    response = sdk.responses.create(
        model="chat", input="The weather?", tools=[tool], tool_choice="required", max_output_tokens=TOOL_LIMIT
    )
    assert response.status in ("completed", "incomplete") and response.tool_choice == "required"
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        assert call.name == "get_weather" and call.call_id and isinstance(call.arguments, str)
    assert all(item.type in ("message", "function_call") for item in response.output)
    response.model_dump_json()


def test_a_forced_tool_call_through_messages(claude: anthropic.Anthropic) -> None:
    tool = {"name": "get_weather", "description": "The weather.", "input_schema": WEATHER_PARAMETERS}
    message = claude.messages.create(
        model="chat",
        max_tokens=TOOL_LIMIT,
        tools=[tool],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "The weather?"}],
    )
    assert message.stop_reason in ("tool_use", "max_tokens", "end_turn")
    assert all(block.type in ("text", "tool_use") for block in message.content)
    if message.stop_reason == "tool_use":
        call = message.content[-1]
        assert call.type == "tool_use" and call.name == "get_weather" and isinstance(call.input, dict) and call.id
    message.to_json()


GREEDY = 0.0
"""Greedy decoding: the tiny model's weights are fixed, so what it writes under a grammar is the same every run."""
UNITS = ("celsius", "fahrenheit")


def test_a_named_strict_tool_is_called_through_responses(sdk: openai.OpenAI) -> None:
    """A named function with a strict schema: both engines constrain the arguments to the schema (SGLang only for a
    strict tool), so the greedy model writes a call the engine parses, whole and streamed."""
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS, "strict": True}
    ask: dict[str, Any] = {
        "model": "chat",
        "input": "The weather?",
        "tools": [tool],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 200,
        "temperature": GREEDY,
    }
    whole = sdk.responses.create(**ask)
    events = list(sdk.responses.create(**ask, stream=True))
    types = [event.type for event in events]
    assert "response.function_call_arguments.done" in types
    assert types[-1] == f"response.{events[-1].response.status}"
    for response in (whole, events[-1].response):
        assert response.status in ("completed", "incomplete")
        calls = [item for item in response.output if item.type == "function_call"]
        assert [call.name for call in calls] == ["get_weather"], response.output
        assert calls[0].call_id and json.loads(calls[0].arguments)["unit"] in UNITS
        response.model_dump_json()


def test_a_streamed_named_tool_call_through_messages(claude: anthropic.Anthropic, world: World) -> None:
    """Anthropic tools carry no ``strict``: vLLM still holds the arguments to the schema, so its call parses whole;
    SGLang leaves them free, and the random model writes what it will, which must still reach the client as an
    object."""
    tool = {"name": "get_weather", "description": "The weather.", "input_schema": WEATHER_PARAMETERS}
    with claude.messages.stream(
        model="chat",
        max_tokens=200,
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "The weather?"}],
        extra_body={"temperature": GREEDY},
    ) as stream:
        names = [event.type for event in stream]
        message = stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert message.stop_reason in ("tool_use", "max_tokens")
    assert all(block.type in ("text", "tool_use") for block in message.content)
    calls = [block for block in message.content if block.type == "tool_use"]
    assert all(call.name == "get_weather" and call.id for call in calls)
    inputs = [call.input for call in calls]
    assert all(isinstance(value, dict) for value in inputs), f"Anthropic's tool input is an object, not {inputs}"
    if world.engine == "vllm":
        assert message.stop_reason == "tool_use" and calls[-1].input["unit"] in UNITS
    message.to_json()
