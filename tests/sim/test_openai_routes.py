"""The replica's OpenAI-compatible routes, through the real ``openai`` client and raw HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.sim.helpers import metric_samples, words
from tests.support.procs import RunningProcess


@pytest.fixture
def oai(replica: RunningProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=replica.url + "/v1", api_key="unused", max_retries=0, timeout=30.0) as client:
        yield client


def test_models(oai: openai.OpenAI) -> None:
    models = oai.models.list().data
    assert [model.id for model in models] == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert models[0].owned_by == "sglang"
    assert oai.models.retrieve("meta-llama/Llama-3.1-8B-Instruct").id == "meta-llama/Llama-3.1-8B-Instruct"


def test_chat_completion(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(
        model="meta-llama/Llama-3.1-8B-Instruct",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": words(50, seed=1)}],
        max_tokens=12,
        extra_body={"rid": "chat-rid-1", "cache_salt": "s1", "priority": 3, "not_a_field": True},
    )
    assert completion.id == "chat-rid-1"
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant" and choice.message.content
    usage = completion.usage
    assert usage is not None and usage.completion_tokens == 12
    assert usage.total_tokens == usage.prompt_tokens + 12
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0


def test_chat_without_limit_stops_naturally(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi there"}])
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "any"  # SGLang echoes the requested model name
    assert completion.usage is not None and 16 <= completion.usage.completion_tokens <= 400


def test_chat_stream_with_usage_chunk(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": words(40, seed=2)}],
        max_completion_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 8
    assert last.usage.prompt_tokens_details is not None and last.usage.prompt_tokens_details.cached_tokens >= 0
    assert len({chunk.id for chunk in chunks}) == 1


def test_stream_wire_format(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(event.startswith("data: ") for event in events[:-1])
    first = json.loads(events[0].removeprefix("data: "))
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert "usage" not in first


def test_completions(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="m", prompt=words(30, seed=3), max_tokens=6)
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 6

    stream = oai.completions.create(
        model="m", prompt=words(30, seed=3), max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    content = [chunk for chunk in chunks if chunk.choices]
    assert content[-1].choices[0].finish_reason == "length"
    assert "".join(chunk.choices[0].text for chunk in content) == completion.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_multi_turn_conversation_hits_the_cache(oai: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": words(300, seed=4)}, {"role": "user", "content": "First question?"}]
    first = oai.chat.completions.create(model="m", messages=messages, max_tokens=20)
    assert first.usage is not None
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Second question?"},
    ]
    second = oai.chat.completions.create(model="m", messages=messages, max_tokens=5)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    # The whole first turn, prompt and reply, is reused.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + 19


def test_errors_are_400_in_sglang_shape(client: httpx.Client) -> None:
    malformed = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code == 400
    body = malformed.json()
    assert body["object"] == "error" and body["code"] == 400 and body["message"]

    missing = client.post("/v1/chat/completions", json={"model": "m"})
    assert missing.status_code == 400 and "messages" in missing.json()["message"]

    wrong_type = client.post("/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 400

    negative = client.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert negative.status_code == 400

    too_long = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 200_000})  # beyond the 128k context
    assert too_long.status_code == 400 and "context length" in too_long.json()["message"]

    bad_role = client.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "hi"}]})
    assert bad_role.status_code == 400


def test_client_disconnect_aborts_the_request(replica: RunningProcess) -> None:
    body = {"messages": [{"role": "user", "content": words(20, seed=5)}], "max_tokens": 20000, "stream": True}
    with httpx.Client(base_url=replica.url, timeout=30.0) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(5):
                next(lines)
        assert metric_samples(replica.url)["sglang:num_running_reqs"] >= 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = metric_samples(replica.url)
        if samples["sglang:num_running_reqs"] == 0 and samples["sglang:num_used_tokens"] == 0:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the disconnected request kept running")
    assert samples["sglang:num_aborted_requests_total"] >= 1


def test_non_streaming_client_disconnect_aborts_too(replica: RunningProcess) -> None:
    body = {"messages": [{"role": "user", "content": words(20, seed=6)}], "max_tokens": 20000}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(replica.url + "/v1/chat/completions", json=body, timeout=0.5)
    deadline = time.monotonic() + 3  # the server checks for a gone client every 0.5 s
    while metric_samples(replica.url)["sglang:num_running_reqs"] > 0:
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.05)
