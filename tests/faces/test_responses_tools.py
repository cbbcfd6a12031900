"""Function calling and failures through the Responses API, with the official ``openai`` SDK against a real gateway.

The replica is :mod:`tests.faces.responses_tool_replica` (it calls the first tool offered, and lists what it was
sent), or :mod:`tests.gateway.lying_replica` for a stream that breaks after its first event.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.faces.responses_tool_replica import ARGUMENTS, TEXT, THOUGHT
from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_lying_replica
from tests.support.procs import RunningProcess, free_port, start_process
from tests.support.sdk_warnings import FAIL_ON_SDK_WARNINGS

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def start_tool_replica(log_dir: Path) -> RunningProcess:
    port = free_port()
    command = [sys.executable, "-m", "tests.faces.responses_tool_replica", "--port", str(port)]
    return start_process(command, port=port, log_dir=log_dir, ready_path="/ready", timeout=30, name="tool-replica")


@pytest.fixture(scope="module")
def tool_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    replica = start_tool_replica(tmp_path_factory.mktemp("tool-replica"))
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def served(tool_replica: RunningProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    gateway = start_gateway(gateway_config([tool_replica.url]), tmp_path_factory.mktemp("tool-gateway"))
    yield gateway
    gateway.stop()


@pytest.fixture
def client(served: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=TENANT_KEY, max_retries=0)


# The SDK reads every answer without a warning.
pytestmark = FAIL_ON_SDK_WARNINGS


def last_received(replica: RunningProcess) -> dict[str, Any]:
    received = httpx.get(replica.url + "/received").json()
    return received[-1]


def test_a_function_call_and_its_output_by_previous_response_id(
    client: openai.OpenAI, tool_replica: RunningProcess
) -> None:
    first = client.responses.create(model="chat", input="Weather in Paris?", tools=[WEATHER], tool_choice="auto")

    [call] = first.output
    assert call.type == "function_call"
    assert call.name == "get_weather" and call.arguments == ARGUMENTS and call.status == "completed"
    assert call.call_id == "call_weather_1" and call.id and call.id.startswith("fc_")
    assert first.output_text == ""
    sent = last_received(tool_replica)
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER["description"],
                "parameters": WEATHER["parameters"],
            },
        }
    ]
    assert sent["tool_choice"] == "auto"

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}
    second = client.responses.create(model="chat", previous_response_id=first.id, input=[output], tools=[WEATHER])

    assert second.output_text == TEXT
    assert last_received(tool_replica)["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_weather_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGUMENTS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_weather_1", "content": "sunny, 24 C"},
    ]


def test_sending_the_output_items_back_is_the_same_prompt(client: openai.OpenAI, tool_replica: RunningProcess) -> None:
    """Without ``previous_response_id`` the client sends the conversation itself: the replica gets the same bytes."""
    first = client.responses.create(model="chat", input="Weather in Paris?", tools=[WEATHER])
    output = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "rain"}  # type: ignore[union-attr]
    client.responses.create(model="chat", previous_response_id=first.id, input=[output], tools=[WEATHER], store=False)
    chained = last_received(tool_replica)["messages"]

    items: list[Any] = [{"role": "user", "content": "Weather in Paris?"}, *first.output, output]
    client.responses.create(model="chat", input=items, tools=[WEATHER], store=False)
    sent = last_received(tool_replica)
    assert sent["messages"] == chained
    assert "tool_choice" not in sent and "parallel_tool_calls" not in sent, "sent only when the client sets them"


def test_reasoning_is_an_output_item_and_stays_out_of_the_next_turn(
    client: openai.OpenAI, tool_replica: RunningProcess
) -> None:
    first = client.responses.create(model="chat", input="Please think first.")

    reasoning, message = first.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == THOUGHT and reasoning.summary == []
    assert message.type == "message" and first.output_text == TEXT

    client.responses.create(model="chat", previous_response_id=first.id, input="Thanks.")
    conversation = [
        {"role": "user", "content": "Please think first."},
        {"role": "assistant", "content": TEXT},
        {"role": "user", "content": "Thanks."},
    ]
    assert last_received(tool_replica)["messages"] == conversation
    # Sent back by the client, the reasoning item is left out the same way.
    items: list[Any] = [
        {"role": "user", "content": "Please think first."},
        *first.output,
        {"role": "user", "content": "Thanks."},
    ]
    client.responses.create(model="chat", input=items, store=False)
    assert last_received(tool_replica)["messages"] == conversation


def test_streamed_reasoning(client: openai.OpenAI) -> None:
    with client.responses.stream(model="chat", input="Please think, then answer.") as stream:
        events = list(stream)
        final = stream.get_final_response()

    types = [event.type for event in events]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    thought = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    assert thought == "".join(word + " " for word in THOUGHT.split(" "))
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    reasoning, message = final.output
    assert reasoning.type == "reasoning" and reasoning.content is not None and reasoning.content[0].text == thought
    assert message.type == "message" and final.output_text.strip() == TEXT


def test_a_streamed_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model="chat", input="Weather in Paris?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()

    types = [event.type for event in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert len(deltas) == 2 and "".join(deltas) == ARGUMENTS
    [call] = final.output
    assert call.type == "function_call" and call.arguments == ARGUMENTS and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert final.usage is not None and final.usage.total_tokens == 27


def test_a_streamed_answer_after_a_function_output(client: openai.OpenAI) -> None:
    first = client.responses.create(model="chat", input="Weather in Paris?", tools=[WEATHER])
    output = {"type": "function_call_output", "call_id": "call_weather_1", "output": "sunny"}
    with client.responses.stream(
        model="chat", previous_response_id=first.id, input=[output], tools=[WEATHER]
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "".join(word + " " for word in TEXT.split(" "))  # each word streamed with a space
    assert final.status == "completed"


@pytest.fixture(scope="module")
def breaking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A gateway over one replica whose streams break after their first event."""
    log_dir = tmp_path_factory.mktemp("breaking")
    replica = start_lying_replica(log_dir, "broken_midstream")
    try:
        gateway = start_gateway(gateway_config([replica.url]), log_dir)
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        replica.stop()


def test_a_stream_that_breaks_ends_with_response_failed(breaking: RunningProcess) -> None:
    client = openai.OpenAI(base_url=breaking.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    events = list(client.responses.create(model="chat", input="Hello?", stream=True))

    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"
    assert failed.response.error.message
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_reasoning_effort_and_cache_key_reach_the_replica(client: openai.OpenAI, tool_replica: RunningProcess) -> None:
    response = client.responses.create(
        model="chat", input="Hi.", reasoning={"effort": "low"}, prompt_cache_key="user-7", temperature=0.5
    )
    sent = last_received(tool_replica)
    assert sent["reasoning_effort"] == "low" and sent["prompt_cache_key"] == "user-7" and sent["temperature"] == 0.5
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert response.prompt_cache_key == "user-7" and response.temperature == 0.5
