"""The OpenAI surface, through the real ``openai`` client against a running gateway and replicas."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.gateway import OTHER_KEY, TENANT_KEY, replica_name
from tests.support.procs import RunningProcess

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three prime numbers."},
]


@pytest.fixture
def client(gateway: RunningProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)


def test_non_streaming_chat_returns_usage_and_routing_headers(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="chat", messages=MESSAGES, max_tokens=12)
    completion = raw.parse()

    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 12
    assert completion.usage.prompt_tokens > 10
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens is not None
    assert raw.headers["x-spillgate-backend"].startswith("pool/")
    assert raw.headers["x-spillgate-reason"] == "least_load"
    assert len(raw.headers["x-request-id"]) >= 16


def test_streaming_chat_relays_chunks_and_headers(client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="chat", messages=MESSAGES, max_tokens=20, stream=True
    ) as response:
        assert response.headers["x-spillgate-backend"].startswith("pool/")
        assert response.headers["x-spillgate-reason"] == "least_load"
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(response.parse())

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 10, "tokens must arrive as separate chunks, not one buffered blob"
    assert all(c.usage is None for c in chunks), "no usage chunk unless the client asks for it"


def test_streaming_usage_chunk_when_asked(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1
    assert usage_chunks[0].usage.completion_tokens == 8
    assert usage_chunks[0].usage.prompt_tokens_details.cached_tokens is not None


def test_completions_streaming_and_not(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="chat", prompt="Once upon a time", max_tokens=6)
    assert completion.choices[0].text
    assert completion.usage.completion_tokens == 6

    pieces = [
        c.choices[0].text
        for c in client.completions.create(model="chat", prompt="Once upon a time", max_tokens=6, stream=True)
        if c.choices
    ]
    assert "".join(pieces).strip()


@pytest.mark.parametrize("path", ["/v1/chat/completions/", "/v1/completions/"])
def test_a_trailing_slash_is_served_like_the_path_without(gateway: RunningProcess, path: str) -> None:
    body = {"model": "chat", "max_tokens": 3}
    body.update({"messages": MESSAGES} if "chat" in path else {"prompt": "Once upon a time"})
    response = httpx.post(gateway.url + path, json=body, headers={"authorization": f"Bearer {TENANT_KEY}"})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


def test_route_aliases_and_request_id_passthrough(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="chat-rr", messages=MESSAGES, max_tokens=2, extra_headers={"x-request-id": "trace-abc-123"}
    )
    assert raw.headers["x-request-id"] == "trace-abc-123"
    assert raw.headers["x-spillgate-reason"] == "round_robin"


def test_models_lists_only_the_routes_a_tenant_may_use(gateway: RunningProcess) -> None:
    mine = {m.id for m in openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY).models.list()}
    theirs = {m.id for m in openai.OpenAI(base_url=gateway.url + "/v1", api_key=OTHER_KEY).models.list()}
    assert mine == {"chat", "chat-rr"}
    assert theirs == {"chat-rr"}


def test_round_robin_spreads_evenly(client: openai.OpenAI, replicas: list[RunningProcess]) -> None:
    backends = [
        client.chat.completions.with_raw_response.create(model="chat-rr", messages=MESSAGES, max_tokens=1).headers[
            "x-spillgate-backend"
        ]
        for _ in range(3 * len(replicas))
    ]
    assert sorted(set(backends)) == sorted(replica_name(replica) for replica in replicas)
    assert all(backends.count(b) == 3 for b in set(backends))


def test_least_load_spreads_concurrent_streams(client: openai.OpenAI, replicas: list[RunningProcess]) -> None:
    """Streams held open at once must land on different replicas: in-flight counts steer least_load.

    4,000 tokens (~1 MB of events) cannot drain into socket buffers while the client does not read, so
    each stream stays in flight on its replica for the whole test.
    """
    responses = [
        client.chat.completions.with_streaming_response.create(
            model="chat", messages=MESSAGES, max_tokens=4000, stream=True
        )
        for _ in replicas
    ]
    opened = [r.__enter__() for r in responses]
    try:
        backends = {r.headers["x-spillgate-backend"] for r in opened}
    finally:
        for r in responses:
            r.__exit__(None, None, None)
    assert len(backends) == len(replicas)
