"""OpenAI's Responses API through the official ``openai`` SDK, against a real gateway over a simulated replica.

The simulated model's reply depends only on the prompt it is given, so a Responses turn and the chat request that
sends what the turn should have become get the same text: that is how these tests see what the replica received.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess
from tests.support.sdk_warnings import FAIL_ON_SDK_WARNINGS

FAST = ("--time-scale", "0.02")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A gateway over one simulated replica: every turn of a conversation meets the same model."""
    log_dir = tmp_path_factory.mktemp("responses")
    replica = start_replica(log_dir, *FAST)
    try:
        gateway = start_gateway(gateway_config([replica.url]), log_dir)
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        replica.stop()


@pytest.fixture
def client(served: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=TENANT_KEY, max_retries=0)


# The SDK reads every answer without a warning.
pytestmark = FAIL_ON_SDK_WARNINGS


def chat_text(client: openai.OpenAI, messages: list[dict[str, Any]], max_tokens: int, model: str = "chat") -> str:
    """What the model answers to ``messages`` sent as a chat request."""
    completion = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)  # type: ignore[arg-type]
    return completion.choices[0].message.content or ""


def test_a_plain_response_parses_whole(client: openai.OpenAI) -> None:
    response = client.responses.create(model="chat", input="Name three prime numbers.")

    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.output_text.strip()
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.previous_response_id is None
    response.model_dump_json()  # serialising warns on any field of the wrong type


def test_the_replica_gets_the_input_and_instructions(client: openai.OpenAI) -> None:
    instructions, question = "Answer in one short line.", "Which planet is largest?"
    response = client.responses.create(model="chat", instructions=instructions, input=question, max_output_tokens=12)

    expected = chat_text(
        client, [{"role": "system", "content": instructions}, {"role": "user", "content": question}], 12
    )
    assert response.output_text == expected
    assert response.instructions == instructions
    assert response.status == "incomplete"  # the limit cut it
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 12


def test_message_items_become_the_conversation(client: openai.OpenAI) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "Again."},
    ]
    response = client.responses.create(model="chat", input=items, max_output_tokens=9)

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again."},
    ]
    assert response.output_text == chat_text(client, messages, 9)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model="chat", instructions="Be terse.", input="Tell me about cats " * 40)
    second = client.responses.create(
        model="chat", instructions="Be terse.", previous_response_id=first.id, input="And dogs?", max_output_tokens=10
    )

    conversation = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Tell me about cats " * 40},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And dogs?"},
    ]
    assert second.output_text == chat_text(client, conversation, 10)
    assert second.previous_response_id == first.id
    alone = client.responses.create(model="chat", instructions="Be terse.", input="And dogs?", max_output_tokens=10)
    assert alone.output_text != second.output_text
    # The chained prompt starts with the first turn's whole prompt, which the replica still caches.
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 64


def test_instructions_are_not_carried_over(client: openai.OpenAI) -> None:
    first = client.responses.create(model="chat", instructions="Speak like a pirate.", input="Hi.", max_output_tokens=5)
    second = client.responses.create(model="chat", previous_response_id=first.id, input="Bye.", max_output_tokens=7)

    conversation = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Bye."},
    ]
    assert second.output_text == chat_text(client, conversation, 7)
    assert second.instructions is None


def test_a_stream_has_the_responses_events(client: openai.OpenAI) -> None:
    with client.responses.stream(model="chat", input="Tell me a story.", max_output_tokens=20) as stream:
        events = list(stream)
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) >= 5, "text arrives piece by piece"
    closing = events[-1]
    assert closing.type == "response.incomplete"
    assert closing.response.output_text == "".join(deltas)
    assert closing.response.usage is not None and closing.response.usage.output_tokens == 20


def test_the_stream_helper_returns_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="chat", input="Name a color.") as stream:
        text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == text and text.strip()
    assert final.usage is not None and final.usage.output_tokens > 0
    final.model_dump_json()


def test_stream_true_iterates_and_its_response_chains(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="chat", input="Count to three.", max_output_tokens=8, stream=True))
    completed = events[-1]
    assert completed.type == "response.incomplete"
    first = completed.response

    second = client.responses.create(model="chat", previous_response_id=first.id, input="Go on.", max_output_tokens=6)
    conversation = [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Go on."},
    ]
    assert second.output_text == chat_text(client, conversation, 6)


def test_an_unknown_previous_response_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="chat", previous_response_id="resp_nothing", input="Hi.")
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"


def test_another_tenant_cannot_chain_to_a_response(client: openai.OpenAI, served: RunningProcess) -> None:
    mine = client.responses.create(model="chat-rr", input="A secret.", max_output_tokens=3)
    other = openai.OpenAI(base_url=served.url + "/v1", api_key=OTHER_KEY, max_retries=0)

    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="chat-rr", previous_response_id=mine.id, input="Tell me.")
    theirs = other.responses.create(model="chat-rr", input="Mine.", max_output_tokens=3)
    other.responses.create(model="chat-rr", previous_response_id=theirs.id, input="Go on.", max_output_tokens=3)


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    unstored = client.responses.create(model="chat", input="Forget this.", store=False, max_output_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="chat", previous_response_id=unstored.id, input="What was it?")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "chat"}, "input"),
        ({"model": "chat", "input": []}, "input"),
        ({"model": "chat", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"model": "chat", "input": [{"role": "critic", "content": "x"}]}, "input[0].role"),
        ({"model": "chat", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"model": "chat", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "chat", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "chat", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "chat", "input": "x", "temperature": "hot"}, "temperature"),
        ({"model": "chat", "input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"model": "chat", "input": "x", "metadata": {"n": 1}}, "metadata"),
        ({"model": "chat", "input": "x", "background": True}, "background"),
        ({"input": "x"}, "model"),
    ],
)
def test_bad_requests_are_400_naming_the_parameter(served: RunningProcess, body: dict[str, Any], param: str) -> None:
    answer = httpx.post(served.url + "/v1/responses", json=body, headers={"authorization": f"Bearer {TENANT_KEY}"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]


def test_a_body_that_is_not_json_is_400(served: RunningProcess) -> None:
    headers = {"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"}
    answer = httpx.post(served.url + "/v1/responses", content=b"{not json", headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_json"


def test_json_schema_text_format_reaches_the_replica(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    response = client.responses.create(
        model="chat",
        input="Give me JSON.",
        text={"format": {"type": "json_schema", "name": "thing", "schema": schema}},
        max_output_tokens=4,
    )
    assert response.text is not None and response.text.format.type == "json_schema"


def test_without_a_key_it_is_401(served: RunningProcess) -> None:
    answer = httpx.post(served.url + "/v1/responses", json={"model": "chat", "input": "x"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A gateway that keeps two responses per tenant, for two seconds."""
    log_dir = tmp_path_factory.mktemp("bounded")
    replica = start_replica(log_dir, *FAST)
    try:
        config = gateway_config([replica.url], responses={"store_ttl_s": 2, "max_stored_per_tenant": 2})
        gateway = start_gateway(config, log_dir)
        try:
            yield gateway
        finally:
            gateway.stop()
    finally:
        replica.stop()


def test_stored_responses_are_bounded_per_tenant(bounded: RunningProcess) -> None:
    client = openai.OpenAI(base_url=bounded.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    ids = [client.responses.create(model="chat", input=f"Turn {i}.", max_output_tokens=2).id for i in range(3)]

    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="chat", previous_response_id=ids[0], input="Oldest?", store=False)
    for kept in ids[1:]:
        client.responses.create(
            model="chat", previous_response_id=kept, input="Kept?", store=False, max_output_tokens=2
        )


def test_stored_responses_expire(bounded: RunningProcess) -> None:
    client = openai.OpenAI(base_url=bounded.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    stored = client.responses.create(model="chat", input="Short-lived.", max_output_tokens=2)
    client.responses.create(
        model="chat", previous_response_id=stored.id, input="Now?", store=False, max_output_tokens=2
    )

    time.sleep(2.5)  # past the two seconds a response is kept
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="chat", previous_response_id=stored.id, input="Later?", store=False)


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A gateway whose route ``frontier`` is a simulated hosted OpenAI model (no replicas)."""
    model: dict[str, Any] = {"name": "frontier", "model": "openai/frontier", "api_key": "sk-provider"}
    model |= {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    model["simulated"] = {"ttft_ms": 20, "tpot_ms": 2}
    config = gateway_config([], pools=[], hosted_models=[model], routes=[{"name": "frontier", "targets": ["frontier"]}])
    config["tenants"] = [{"name": "tenant-a", "keys": [TENANT_KEY]}]
    gateway = start_gateway(config, tmp_path_factory.mktemp("responses-hosted"))
    yield gateway
    gateway.stop()


def test_a_hosted_model_answers_whole_streamed_and_chained(hosted: RunningProcess) -> None:
    client = openai.OpenAI(base_url=hosted.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    first = client.responses.create(model="frontier", instructions="Be brief.", input="Hello there.")
    assert first.status == "completed" and first.output_text.strip()
    assert first.usage is not None and first.usage.input_tokens > 0

    with client.responses.stream(model="frontier", previous_response_id=first.id, input="And then?") as stream:
        final = stream.get_final_response()
    assert final.previous_response_id == first.id and final.output_text.strip()
    # The chained prompt holds the first turn: more input tokens than the first turn's prompt and answer.
    assert final.usage is not None and first.usage is not None
    assert final.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 8
