"""The hosted-model simulator: OpenAI wire format, bearer auth, latency profile."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from spillgate.backends.sim.hosted_faults import FaultConfig, FaultSchedule
from tests.sim.conftest import StartReplica
from tests.support.procs import RunningProcess


@pytest.fixture(scope="module")
def hosted(start_sim: StartReplica) -> RunningProcess:
    return start_sim("sim-hosted", "--ttft-ms", "400", "--tpot-ms", "10", "--time-scale", "0.2", "--seed", "3")


@pytest.fixture
def oai(hosted: RunningProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=hosted.url + "/v1", api_key="sk-anything", max_retries=0, timeout=30.0) as client:
        yield client


def test_requires_a_bearer_key(hosted: RunningProcess) -> None:
    body = {"model": "frontier-large", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(hosted.url + "/v1/chat/completions", json=body)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    for header in ("Bearer", "Basic c2stYW55"):
        rejected = httpx.post(hosted.url + "/v1/chat/completions", json=body, headers={"authorization": header})
        assert rejected.status_code == 401
    accepted = httpx.get(hosted.url + "/v1/models", headers={"authorization": "Bearer any-key"})
    assert accepted.status_code == 200
    assert httpx.get(hosted.url + "/health").status_code == 200


def test_streams_with_its_latency_profile(oai: openai.OpenAI) -> None:
    started = time.perf_counter()
    stream = oai.chat.completions.create(
        model="frontier-large",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    first: float | None = None
    chunks = []
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        chunks.append(chunk)
    total = time.perf_counter() - started
    assert first is not None and first >= 0.4 * 0.2 * 0.9  # TTFT 400 ms +-10% at time-scale 0.2
    assert total >= first
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_non_streaming_and_completions(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions.create(model="frontier-large", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].finish_reason == "stop" and chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.prompt_tokens > 0
    again = oai.chat.completions.create(model="frontier-large", messages=[{"role": "user", "content": "hi"}])
    assert again.choices[0].message.content == chat.choices[0].message.content  # deterministic
    completion = oai.completions.create(model="frontier-large", prompt="Once upon a time", max_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert [model.id for model in oai.models.list().data] == ["frontier-large"]


ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-anything", "anthropic-version": "2023-06-01"}


def anthropic_body(**fields: object) -> dict[str, object]:
    body = {"model": "claude-sim", "max_tokens": 5, "messages": [{"role": "user", "content": "Tell me a story."}]}
    return {**body, **fields}


def sse_events(text: str) -> list[tuple[str, dict[str, object]]]:
    """(event name, data) pairs of an Anthropic event stream."""
    pairs = []
    for block in text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        pairs.append((name_line[len("event: ") :], json.loads(data_line[len("data: ") :])))
    return pairs


def test_anthropic_messages_require_its_headers(hosted: RunningProcess) -> None:
    url = hosted.url + "/v1/messages"
    missing_key = httpx.post(url, json=anthropic_body(), headers={"anthropic-version": "2023-06-01"})
    assert missing_key.status_code == 401
    assert missing_key.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "x-api-key header is required"},
    }
    missing_version = httpx.post(url, json=anthropic_body(), headers={"x-api-key": "k"})
    assert missing_version.status_code == 400 and missing_version.json()["error"]["type"] == "invalid_request_error"
    no_max_tokens = httpx.post(url, json={"model": "m", "messages": []}, headers=ANTHROPIC_HEADERS)
    assert no_max_tokens.status_code == 400 and "max_tokens" in no_max_tokens.json()["error"]["message"]


def test_anthropic_message_body(hosted: RunningProcess) -> None:
    body = anthropic_body(system="Be brief.", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    reply = httpx.post(hosted.url + "/v1/messages", json=body, headers=ANTHROPIC_HEADERS, timeout=10).json()
    assert reply["type"] == "message" and reply["role"] == "assistant" and reply["model"] == "claude-sim"
    assert reply["id"].startswith("msg_") and reply["stop_reason"] == "max_tokens" and reply["stop_sequence"] is None
    assert [block["type"] for block in reply["content"]] == ["text"] and reply["content"][0]["text"]
    usage = reply["usage"]
    assert usage["output_tokens"] == 5 and usage["input_tokens"] > 0 and usage["cache_read_input_tokens"] == 0


def test_anthropic_event_stream(hosted: RunningProcess) -> None:
    body = anthropic_body(stream=True)
    with httpx.stream("POST", hosted.url + "/v1/messages", json=body, headers=ANTHROPIC_HEADERS, timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        pairs = sse_events(resp.read().decode())
    names = [name for name, _ in pairs]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(name == data["type"] for name, data in pairs)
    start = pairs[0][1]["message"]
    assert isinstance(start, dict) and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0 and start["usage"]["output_tokens"] == 1
    deltas = [data["delta"] for name, data in pairs if name == "content_block_delta"]
    assert all(delta["type"] == "text_delta" and delta["text"] for delta in deltas)  # type: ignore[index]
    message_delta = pairs[-2][1]
    assert message_delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert message_delta["usage"] == {"output_tokens": 5}
    whole = httpx.post(hosted.url + "/v1/messages", json=anthropic_body(), headers=ANTHROPIC_HEADERS, timeout=10)
    assert "".join(delta["text"] for delta in deltas) == whole.json()["content"][0]["text"]  # type: ignore[index]


def test_repeated_long_prompts_are_reported_cached(hosted: RunningProcess) -> None:
    prompt = " ".join(f"rule {i}: answer tersely." for i in range(300))
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    headers = {"authorization": "Bearer k"}
    first = httpx.post(hosted.url + "/v1/chat/completions", json=body, headers=headers, timeout=10).json()["usage"]
    again = httpx.post(hosted.url + "/v1/chat/completions", json=body, headers=headers, timeout=10).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and cached % 128 == 0 and cached <= again["prompt_tokens"]
    anthropic = anthropic_body(messages=[{"role": "user", "content": prompt}], max_tokens=1)
    usage = httpx.post(hosted.url + "/v1/messages", json=anthropic, headers=ANTHROPIC_HEADERS, timeout=10).json()[
        "usage"
    ]
    assert usage["cache_read_input_tokens"] == cached and usage["input_tokens"] == again["prompt_tokens"] - cached


def test_injected_status_failures_are_deterministic(start_sim: StartReplica) -> None:
    sim = start_sim("sim-hosted", "--ttft-ms", "1", "--tpot-ms", "1", "--fail-429-every", "2", "--fail-500-every", "3")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    statuses = []
    for ordinal in range(1, 7):
        if ordinal % 2:
            response = httpx.post(sim.url + "/v1/chat/completions", json=chat, headers={"authorization": "Bearer k"})
        else:
            response = httpx.post(sim.url + "/v1/messages", json=anthropic_body(), headers=ANTHROPIC_HEADERS)
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert response.headers["retry-after"] == "1"
            error = response.json()["error"]
            assert error["type"] in ("rate_limit_error", "requests")
    assert statuses == [200, 429, 500, 429, 200, 429]
    assert httpx.get(sim.url + "/health").status_code == 200  # not counted


def test_injected_stream_faults(start_sim: StartReplica) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    headers = {"authorization": "Bearer k"}
    broken = start_sim("sim-hosted", "--ttft-ms", "1", "--tpot-ms", "1", "--malformed-after-chunks", "3")
    with httpx.stream("POST", broken.url + "/v1/chat/completions", json=body, headers=headers, timeout=10) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert len(lines) == 1 + 3 + 1  # role chunk, three tokens, then the broken one; no [DONE]
    json.loads(lines[-2][len("data: ") :])
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[-1][len("data: ") :])

    silent = start_sim("sim-hosted", "--ttft-ms", "1", "--tpot-ms", "1", "--stall-after-chunks", "2")
    received = []
    with (
        pytest.raises(httpx.ReadTimeout),
        httpx.stream(
            "POST",
            silent.url + "/v1/messages",
            json=anthropic_body(stream=True),
            headers=ANTHROPIC_HEADERS,
            timeout=httpx.Timeout(10, read=0.5),
        ) as resp,
    ):
        for line in resp.iter_lines():
            received.append(line)
    assert sum(line == "event: content_block_delta" for line in received) == 2
    assert "event: message_stop" not in received


def test_fail_rate_is_seeded_and_close_to_the_rate() -> None:
    def statuses(seed: int) -> list[int | None]:
        schedule = FaultSchedule(FaultConfig(fail_rate=0.25, seed=seed))
        return [schedule.next().status for _ in range(2000)]

    first = statuses(seed=1)
    assert first == statuses(seed=1) and first != statuses(seed=2)
    assert set(first) == {None, 500} and 0.22 < first.count(500) / len(first) < 0.28
