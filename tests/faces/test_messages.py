"""Anthropic's Messages API on the gateway, through the official ``anthropic`` SDK: a real gateway process in
front of a simulated SGLang replica (route ``chat``) and a simulated hosted Anthropic model behind litellm's
``anthropic/`` provider (route ``claude``). Every SDK call runs with warnings as errors."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate

PROVIDER_KEY = "sk-provider-secret-4242"
HELLO = [{"role": "user", "content": "Name three prime numbers."}]


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """The whole prompt: Anthropic's ``input_tokens`` leave out what was read from or written to the cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def start_hosted(log_dir: Path) -> RunningProcess:
    port = free_port()
    args = ["sim-hosted", "--port", str(port), "--ttft-ms", "5", "--tpot-ms", "1", "--model-name", "claude-sim"]
    return start_spillgate([*args, "--prompt-cache-min-tokens", "256"], port=port, log_dir=log_dir)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir = tmp_path_factory.mktemp("messages")
    replica = start_replica(log_dir, "--time-scale", "0.02")
    hosted = start_hosted(log_dir)
    config = gateway_config([replica.url])
    config["hosted_models"] = [
        {
            "name": "claude",
            "model": "anthropic/claude-sim",
            "api_base": hosted.url,
            "api_key": PROVIDER_KEY,
            "input_per_mtok": 3,
            "output_per_mtok": 15,
            "cached_input_per_mtok": 0.3,
            "timeout_s": 10,
        }
    ]
    config["routes"].append({"name": "claude", "targets": ["claude"]})
    try:
        proc = start_gateway(config, log_dir)
        try:
            yield proc
        finally:
            proc.stop()
    finally:
        hosted.stop()
        replica.stop()


@pytest.fixture
def client(gateway: RunningProcess) -> Iterator[anthropic.Anthropic]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)


@pytest.mark.parametrize("route", ["chat", "claude"])
def test_a_whole_message(client: anthropic.Anthropic, route: str) -> None:
    raw = client.messages.with_raw_response.create(model=route, max_tokens=7, messages=HELLO)
    message = raw.parse()
    assert raw.headers["x-spillgate-backend"].startswith("pool-" if route == "chat" else "claude")
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == route
    assert [block.type for block in message.content] == ["text"] and message.content[0].text.strip()
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 7 and prompt_tokens(message.usage) > 5


@pytest.mark.parametrize("route", ["chat", "claude"])
def test_a_streamed_message_through_the_sdk_helper(client: anthropic.Anthropic, route: str) -> None:
    with client.messages.stream(model=route, max_tokens=9, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text.strip() and message.content[0].type == "text" and message.content[0].text == text
    assert message.model == route and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 9 and prompt_tokens(message.usage) > 5


def test_a_streamed_message_event_by_event(client: anthropic.Anthropic) -> None:
    events = list(client.messages.create(model="chat", max_tokens=6, messages=HELLO, stream=True))
    names = [event.type for event in events]
    assert names[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [event for event in events if event.type == "content_block_delta"]
    assert len(deltas) >= 3 and all(event.delta.type == "text_delta" for event in deltas)
    final = events[-2]
    assert final.type == "message_delta" and final.usage.output_tokens == 6
    assert (final.usage.input_tokens or 0) + (final.usage.cache_read_input_tokens or 0) > 5


def test_the_event_stream_on_the_wire(gateway: RunningProcess) -> None:
    body = {"model": "chat", "max_tokens": 4, "messages": HELLO, "stream": True}
    headers = {"x-api-key": TENANT_KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", gateway.url + "/v1/messages", json=body, headers=headers, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        blocks = response.read().decode().strip().split("\n\n")
    names = [block.split("\n")[0].removeprefix("event: ") for block in blocks]
    assert names[:3] == ["message_start", "content_block_start", "ping"] and names[-1] == "message_stop"


def test_a_system_prompt_is_part_of_the_prompt(client: anthropic.Anthropic) -> None:
    plain = client.messages.create(model="chat", max_tokens=1, messages=HELLO)
    system = "You are a terse assistant who answers in one word, always, whatever you are asked."
    with_string = client.messages.create(model="chat", max_tokens=1, messages=HELLO, system=system)
    with_blocks = client.messages.create(
        model="chat", max_tokens=1, messages=HELLO, system=[{"type": "text", "text": system}]
    )
    assert prompt_tokens(with_string.usage) > prompt_tokens(plain.usage) + 10
    assert prompt_tokens(with_blocks.usage) == prompt_tokens(with_string.usage)


def test_a_wrong_key_is_an_authentication_error(gateway: RunningProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client.messages.create(model="chat", max_tokens=4, messages=HELLO)
    assert caught.value.status_code == 401
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "authentication_error"


def test_a_route_the_key_may_not_use_is_a_permission_error(gateway: RunningProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):
        client.messages.create(model="chat", max_tokens=4, messages=HELLO)


def test_an_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
    assert caught.value.body["error"] == {
        "type": "not_found_error",
        "message": "The model 'no-such-model' does not exist.",
    }


def test_bad_requests_are_anthropic_invalid_request_errors(gateway: RunningProcess) -> None:
    headers = {"x-api-key": TENANT_KEY, "anthropic-version": "2023-06-01"}
    bodies = [
        {"model": "chat", "messages": HELLO},
        {"model": "chat", "max_tokens": 0, "messages": HELLO},
        {"model": "chat", "max_tokens": 4, "messages": HELLO, "frequency_penalty": 1},
        {"model": "chat", "max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]},
        {"model": "chat", "max_tokens": 4, "messages": HELLO, "tool_choice": {"type": "any"}},
        {"model": "chat", "max_tokens": 10**9, "messages": HELLO},
    ]
    for body in bodies:
        response = httpx.post(gateway.url + "/v1/messages", json=body, headers=headers, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["type"] == "error"
        assert response.json()["error"]["type"] == "invalid_request_error"
    not_json = httpx.post(gateway.url + "/v1/messages", content=b"{", headers=headers, timeout=30)
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"


def test_missing_max_tokens_through_the_sdk(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        # The SDK insists on max_tokens; NOT_GIVEN leaves it out of the body, as another client might.
        client.messages.create(model="chat", messages=HELLO, max_tokens=anthropic.NOT_GIVEN, timeout=30)  # type: ignore[arg-type]
    assert "max_tokens" in caught.value.body["error"]["message"]


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city, for the next few days.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    """On the hosted route: the simulated replica does not call tools, the simulated Anthropic model does."""
    first = client.messages.create(model="claude", max_tokens=8, tools=[WEATHER], messages=ASK_WEATHER)
    assert first.stop_reason == "tool_use"
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id
    assert set(call.input) == {"city", "days"} and isinstance(call.input["days"], int)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and sunny all week long."}
    conversation = [
        *ASK_WEATHER,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    second = client.messages.create(model="claude", max_tokens=5, tools=[WEATHER], messages=conversation)
    assert second.stop_reason == "max_tokens"
    assert [block.type for block in second.content] == ["text"] and second.content[0].text.strip()
    assert prompt_tokens(second.usage) > prompt_tokens(first.usage) + 10  # the call and its result were sent


def test_a_streamed_tool_call(client: anthropic.Anthropic) -> None:
    chosen = {"type": "tool", "name": "get_weather"}
    with client.messages.stream(
        model="claude", max_tokens=6, tools=[WEATHER], tool_choice=chosen, messages=HELLO
    ) as stream:
        events = list(stream)
        message = stream.get_final_message()
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    assert deltas and all(delta.type == "input_json_delta" for delta in deltas)
    assert message.stop_reason == "tool_use" and [block.type for block in message.content] == ["tool_use"]
    assert message.content[0].name == "get_weather" and set(message.content[0].input) == {"city", "days"}
    assert message.usage.output_tokens == 6


def test_tool_choice_none_answers_in_text(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude", max_tokens=4, tools=[WEATHER], tool_choice={"type": "none"}, messages=ASK_WEATHER
    )
    assert [block.type for block in message.content] == ["text"] and message.stop_reason == "max_tokens"
