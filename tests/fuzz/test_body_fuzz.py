"""Fuzz request bodies beyond the schema: any JSON value in any field, nesting as deep as the parser takes.

The OpenAPI fuzz draws bodies that the schema describes; a client is not bound by it. Here every field of a
chat or completions body, and of each message, takes arbitrary JSON (objects where strings belong, bools
where token ids belong, deep arrays), against a running gateway: each answer is a 2xx or an OpenAI-format
4xx, never a 5xx.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
CHAT_FIELDS = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "temperature",
    "top_p",
    "tools",
    "response_format",
    "stop",
    "logprobs",
)
COMPLETION_FIELDS = ("model", "prompt", "stream", "max_tokens", "n", "best_of", "echo", "suffix")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("body-fuzz")
    replica = start_replica(log_dir, "--time-scale", "0.01")
    running = start_gateway(gateway_config([replica.url]), log_dir)
    yield running
    running.stop()
    replica.stop()


def _message() -> st.SearchStrategy[object]:
    base = st.fixed_dictionaries({"role": st.just("user"), "content": st.just("hi")})
    return st.one_of(
        JSON,
        st.builds(lambda b, k, v: {**b, k: v}, base, st.sampled_from(MESSAGE_FIELDS), JSON),
    )


def _chat_body() -> st.SearchStrategy[dict[str, object]]:
    base = st.fixed_dictionaries(
        {"model": st.just("chat"), "messages": st.lists(_message(), min_size=1, max_size=3), "max_tokens": st.just(4)}
    )
    return st.builds(lambda b, k, v: {**b, k: v}, base, st.sampled_from(CHAT_FIELDS), JSON) | base


def _completion_body() -> st.SearchStrategy[dict[str, object]]:
    base = st.fixed_dictionaries({"model": st.just("chat"), "prompt": st.just("hi"), "max_tokens": st.just(4)})
    return st.builds(lambda b, k, v: {**b, k: v}, base, st.sampled_from(COMPLETION_FIELDS), JSON)


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and "Traceback" not in error["message"]


@pytest.mark.parametrize(
    ("path", "bodies", "examples"),
    [("/v1/chat/completions", _chat_body, 150), ("/v1/completions", _completion_body, 100)],
)
def test_any_body_gets_an_answer_or_a_4xx(
    gateway: RunningProcess, path: str, bodies: Callable[[], st.SearchStrategy[dict[str, object]]], examples: int
) -> None:
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=30) as client:

        @given(body=bodies())
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(body: dict[str, object]) -> None:
            _check(client.post(path, json=body))

        fuzz()


@pytest.mark.parametrize("depth", [100, 260, 1000])
def test_deep_nesting_is_refused_in_openai_form(gateway: RunningProcess, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    body = f'{{"model": "chat", "max_tokens": 4, "messages": [{{"role": "user", "content": "hi"}}], "x": {nested}}}'
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {TENANT_KEY}", "content-type": "application/json"},
        timeout=30,
    )
    _check(response)
    if depth > 250:
        assert response.status_code == 400 and "nested" in response.json()["error"]["message"]


@pytest.mark.parametrize("role", [{}, [], 3, None])
def test_a_role_of_the_wrong_type_is_a_422(gateway: RunningProcess, role: object) -> None:
    response = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "chat", "max_tokens": 4, "messages": [{"role": role, "content": "hi"}]},
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=30,
    )
    assert response.status_code == 422 and response.json()["error"]["param"] == "messages[0].role"


@pytest.mark.parametrize("prompt", [[True, False], [[1, True]], [[]], [-1]])
def test_boolean_or_negative_token_ids_are_refused(gateway: RunningProcess, prompt: object) -> None:
    response = httpx.post(
        gateway.url + "/v1/completions",
        json={"model": "chat", "max_tokens": 4, "prompt": prompt},
        headers={"authorization": f"Bearer {TENANT_KEY}"},
        timeout=30,
    )
    assert response.status_code == 422 and response.json()["error"]["param"] == "prompt"
