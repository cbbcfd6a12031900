"""Anthropic's Messages API on the gateway, through the official ``anthropic`` SDK: a real gateway process in
front of a simulated SGLang replica (route ``chat``) and a simulated hosted Anthropic model behind litellm's
``anthropic/`` provider (route ``claude``). Every SDK call runs with warnings as errors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import httpx
import pytest

from spillgate.backends.hosted.pricing import ANTHROPIC_CACHE_WRITE
from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_config, pool_of, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate
from tests.support.sdk_warnings import FAIL_ON_SDK_WARNINGS

# The SDK reads every answer without a warning.
pytestmark = FAIL_ON_SDK_WARNINGS

PROVIDER_KEY = "sk-provider-secret-4242"
HELLO = [{"role": "user", "content": "Name three prime numbers."}]


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    """The whole prompt: Anthropic's ``input_tokens`` leave out what was read from or written to the cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def start_hosted(log_dir: Path, *flags: str) -> RunningProcess:
    port = free_port()
    args = ["sim-hosted", "--port", str(port), "--ttft-ms", "5", "--tpot-ms", "1", "--model-name", "claude-sim"]
    return start_spillgate([*args, "--prompt-cache-min-tokens", "256", *flags], port=port, log_dir=log_dir)


def claude(name: str, api_base: str) -> dict:
    """A hosted ``anthropic/`` model on a simulator, at Claude Sonnet's prices."""
    return {
        "name": name,
        "model": "anthropic/claude-sim",
        "api_base": api_base,
        "api_key": PROVIDER_KEY,
        "input_per_mtok": 3,
        "output_per_mtok": 15,
        "cached_input_per_mtok": 0.3,
        "timeout_s": 10,
    }


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """Routes: ``chat`` (a replica), ``claude`` (a hosted model), ``mixed`` (the replica, spilling to the hosted
    model), ``limited`` (a hosted model that always answers 429), ``broken`` (one whose answers break off after
    three tokens), ``gone`` (a replica nothing answers at)."""
    log_dir = tmp_path_factory.mktemp("messages")
    started: list[RunningProcess] = []
    try:
        started.append(replica := start_replica(log_dir, "--time-scale", "0.02", "--tool-call-parser", "llama3"))
        started.append(hosted := start_hosted(log_dir))
        started.append(limited := start_hosted(log_dir, "--fail-429-every", "1", "--retry-after-s", "7"))
        started.append(broken := start_hosted(log_dir, "--malformed-after-chunks", "3"))
        config = gateway_config([replica.url])
        config["pools"].append(
            {"name": "gone", "served_model": "sim-model", "replicas": [f"http://127.0.0.1:{free_port()}"]}
        )
        config["hosted_models"] = [
            claude("claude", hosted.url),
            claude("limited", limited.url),
            claude("broken", broken.url),
        ]
        config["routes"] += [{"name": name, "targets": [name]} for name in ("claude", "limited", "broken", "gone")]
        spill = {"complexity_threshold": 0.5}
        config["routes"].append(
            {"name": "mixed", "targets": ["pool", "claude"], "policy": "cache_aware", "spill": spill}
        )
        started.append(proc := start_gateway(config, log_dir))
        yield proc
    finally:
        for proc in reversed(started):
            proc.stop()


@pytest.fixture
def client(gateway: RunningProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=TENANT_KEY, max_retries=0)


@pytest.mark.parametrize("route", ["chat", "claude"])
def test_a_whole_message(client: anthropic.Anthropic, route: str) -> None:
    raw = client.messages.with_raw_response.create(model=route, max_tokens=7, messages=HELLO)
    message = raw.parse()
    assert raw.headers["x-spillgate-backend"].startswith("pool/" if route == "chat" else "claude")
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == route
    assert [block.type for block in message.content] == ["text"] and message.content[0].text.strip()
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 7 and prompt_tokens(message.usage) > 5
    message.to_json()  # pydantic warns only when it serialises a field of the wrong type


@pytest.mark.parametrize("route", ["chat", "claude"])
def test_a_streamed_message_through_the_sdk_helper(client: anthropic.Anthropic, route: str) -> None:
    with client.messages.stream(model=route, max_tokens=9, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text.strip() and message.content[0].type == "text" and message.content[0].text == text
    assert message.model == route and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 9 and prompt_tokens(message.usage) > 5
    message.to_json()


def test_a_streamed_message_event_by_event(client: anthropic.Anthropic) -> None:
    events = list(client.messages.create(model="chat", max_tokens=6, messages=HELLO, stream=True))
    names = [event.type for event in events]
    assert names[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    for event in events:
        event.to_json()
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


def test_the_path_without_v1_and_a_wrong_method(gateway: RunningProcess) -> None:
    body = {"model": "chat", "max_tokens": 2, "messages": HELLO}
    headers = {"x-api-key": TENANT_KEY, "anthropic-version": "2023-06-01"}
    response = httpx.post(gateway.url + "/messages", json=body, headers=headers, timeout=30)
    assert response.status_code == 200 and response.json()["type"] == "message"
    wrong = httpx.get(gateway.url + "/v1/messages", headers=headers, timeout=30)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["type"] == "invalid_request_error"


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
    message.to_json()
    assert message.usage.output_tokens == 6


def test_tool_choice_none_answers_in_text(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="claude", max_tokens=4, tools=[WEATHER], tool_choice={"type": "none"}, messages=ASK_WEATHER
    )
    assert [block.type for block in message.content] == ["text"] and message.stop_reason == "max_tokens"


INPUT, OUTPUT, CACHED_INPUT = 3e-6, 15e-6, 0.3e-6
"""The ``claude`` route's prices per token, as its config gives them (cache writes: 1.25 times the input)."""


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not booked in time"
        time.sleep(0.1)


def booked(gateway: RunningProcess, request_id: str) -> dict:
    """The spend-log row of one request, once it is booked."""
    rows: list[dict] = []

    def found() -> bool:
        params = {"route": "claude", "limit": 50}
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        response = httpx.get(gateway.url + "/v1/spend/logs", params=params, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        rows[:] = [row for row in response.json()["data"] if row["request_id"] == request_id]
        return bool(rows)

    eventually(found)
    return rows[0]


def cached_call(client: anthropic.Anthropic, system: list[dict]) -> tuple[anthropic.types.Message, str]:
    request_id = uuid.uuid4().hex
    message = client.messages.create(
        model="claude", max_tokens=3, system=system, messages=HELLO, extra_headers={"x-request-id": request_id}
    )
    return message, request_id


def long_cached_system() -> list[dict]:
    """A system prompt of some 1,500 tokens no other test sends, marked for caching."""
    rules = " ".join(f"rule {i} of {uuid.uuid4().hex[:6]}: answer tersely." for i in range(120))
    return [{"type": "text", "text": rules, "cache_control": {"type": "ephemeral"}}]


def test_cache_reads_are_reported_and_priced_as_anthropic_bills_them(
    client: anthropic.Anthropic, gateway: RunningProcess
) -> None:
    system = long_cached_system()
    cached_call(client, system)
    again, request_id = cached_call(client, system)
    read = again.usage.cache_read_input_tokens
    assert read is not None and read >= 256 and again.usage.cache_creation_input_tokens == 0
    assert read % 128 == 0 and 0 <= again.usage.input_tokens < 128  # what is left past the last full cache block
    row = booked(gateway, request_id)
    assert row["prompt_tokens"] == prompt_tokens(again.usage) and row["cached_tokens"] == read
    expected = again.usage.input_tokens * INPUT + read * CACHED_INPUT + again.usage.output_tokens * OUTPUT
    assert row["cost_usd"] == pytest.approx(expected)


def test_cache_writes_are_reported_and_priced_as_anthropic_bills_them(
    client: anthropic.Anthropic, gateway: RunningProcess
) -> None:
    """The first request with a prompt marked for caching writes it: 1.25 times the input price."""
    system = long_cached_system()
    first, request_id = cached_call(client, system)
    written = first.usage.cache_creation_input_tokens
    assert written is not None and written >= 256 and first.usage.cache_read_input_tokens == 0
    assert written % 128 == 0 and 0 <= first.usage.input_tokens < 128  # past the last full block (none if it ends one)
    again, _ = cached_call(client, system)
    assert again.usage.cache_read_input_tokens == written and again.usage.input_tokens == first.usage.input_tokens
    row = booked(gateway, request_id)
    assert row["prompt_tokens"] == prompt_tokens(first.usage) and row["cached_tokens"] == 0
    write_price = INPUT * ANTHROPIC_CACHE_WRITE
    expected = first.usage.input_tokens * INPUT + written * write_price + first.usage.output_tokens * OUTPUT
    assert row["cost_usd"] == pytest.approx(expected)


def test_a_rate_limit_keeps_its_status_and_retry_after(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="limited", max_tokens=4, messages=HELLO)
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.body["error"]["type"] == "rate_limit_error"


def test_no_healthy_backend_is_overloaded(client: anthropic.Anthropic, gateway: RunningProcess) -> None:
    def unserved() -> bool:
        health = httpx.get(gateway.url + "/health", timeout=30).json()
        return "gone" in health.get("routes_without_healthy_backend", ())

    eventually(unserved)  # its replica failed a probe
    with pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(model="gone", max_tokens=4, messages=HELLO)
    assert caught.value.status_code == 503 and caught.value.response.headers["retry-after"] == "1"
    assert caught.value.body["error"]["type"] == "overloaded_error"


def test_a_backend_failing_mid_stream_ends_it_with_an_error_event(client: anthropic.Anthropic) -> None:
    events: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        for event in client.messages.create(model="broken", max_tokens=20, messages=HELLO, stream=True):
            events.append(event.type)
    assert events[0] == "message_start" and "content_block_delta" in events and "message_stop" not in events
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "api_error"


def test_a_backend_failing_whole_is_an_api_error(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(model="broken", max_tokens=20, messages=HELLO)
    assert caught.value.status_code == 502 and caught.value.body["error"]["type"] == "api_error"


def test_a_body_over_the_limit_is_request_too_large(client: anthropic.Anthropic) -> None:
    huge = [{"role": "user", "content": "x" * (5 << 20)}]
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="chat", max_tokens=4, messages=huge)
    assert caught.value.status_code == 413 and caught.value.body["error"]["type"] == "request_too_large"


def test_a_bearer_token_and_anthropics_headers_are_accepted(gateway: RunningProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, auth_token=TENANT_KEY, max_retries=0)
    beta = {"anthropic-beta": "prompt-caching-2024-07-31"}
    message = client.messages.create(model="chat", max_tokens=2, messages=HELLO, extra_headers=beta)
    assert message.usage.output_tokens == 2


def test_blocks_a_replica_takes(client: anthropic.Anthropic) -> None:
    """Text blocks marked for caching, an image, and an earlier assistant turn, on a replica. On a route that may
    spill to an Anthropic model ``cache_control`` is kept, so the replica gets it too, and takes it."""
    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": pixel}}
    cached = {"type": "text", "text": "Describe this picture.", "cache_control": {"type": "ephemeral"}}
    conversation = [
        {"role": "user", "content": "Hello."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello! How can I help?"}]},
        {"role": "user", "content": [image, cached]},
    ]
    system = [{"type": "text", "text": "You describe pictures.", "cache_control": {"type": "ephemeral"}}]
    for route in ("chat", "mixed"):
        raw = client.messages.with_raw_response.create(model=route, max_tokens=3, system=system, messages=conversation)
        assert pool_of(raw.headers["x-spillgate-backend"]) == "pool"
        message = raw.parse()
        assert message.content[0].text and message.usage.output_tokens == 3


def test_the_end_user_is_booked(client: anthropic.Anthropic, gateway: RunningProcess) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    client.messages.create(model="chat", max_tokens=2, messages=HELLO, metadata={"user_id": user})

    def booked_for_user() -> bool:
        params = {"user": user}
        headers = {"authorization": f"Bearer {TENANT_KEY}"}
        response = httpx.get(gateway.url + "/v1/spend/logs", params=params, headers=headers, timeout=30)
        return [row["route"] for row in response.json()["data"]] == ["chat"]

    eventually(booked_for_user)


def test_a_stop_sequence_is_named(client: anthropic.Anthropic) -> None:
    first = client.messages.create(model="chat", max_tokens=12, messages=HELLO)
    words = first.content[0].text.split()
    stop = words[3]
    message = client.messages.create(model="chat", max_tokens=12, messages=HELLO, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert stop not in message.content[0].text


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_replica_forced_to_call_a_tool(client: anthropic.Anthropic, choice: dict) -> None:
    """A replica calls a tool when forced to (a grammar, as SGLang and vLLM do), whole and streamed; with
    ``auto`` the simulated replica answers in text, so the round trip runs on the hosted route above."""
    message = client.messages.create(
        model="chat", max_tokens=200, tools=[WEATHER], tool_choice=choice, messages=ASK_WEATHER
    )
    assert message.stop_reason == "tool_use", message
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and isinstance(call.input, dict) and call.id
    with client.messages.stream(
        model="chat", max_tokens=200, tools=[WEATHER], tool_choice=choice, messages=ASK_WEATHER
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[-1].type == "tool_use"
    assert streamed.content[-1].input == call.input
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees and sunny."}
    conversation = [
        *ASK_WEATHER,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [result]},
    ]
    answer = client.messages.create(model="chat", max_tokens=4, tools=[WEATHER], messages=conversation)
    assert answer.content[0].type == "text" and answer.stop_reason == "max_tokens"
