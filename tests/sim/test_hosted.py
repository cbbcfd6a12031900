"""The hosted-model simulator: OpenAI wire format, bearer auth, latency profile."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

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
