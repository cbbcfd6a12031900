"""Answers the gateway gives itself are counted on ``/metrics`` by status, code and tenant; output tokens by
backend and route; and a tenant with per-minute limits is told where it stands in OpenAI's rate-limit headers.

A real gateway process over a simulated replica, read through ``/metrics`` as Prometheus would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from spillgate.gateway.serving.rate_headers import duration
from tests.support.gateway import OTHER_KEY, TENANT_KEY, gateway_over_one_replica, pool_of
from tests.support.procs import RunningProcess

METRICS_TOKEN = "sk-test-metrics-token"
PACED_KEY = "sk-test-paced-tenant"
WRONG_KEY = "sk-wrong-key-0000"
HELLO = [{"role": "user", "content": "hello"}]
CHAT = "/v1/chat/completions"


def paced_tenant_and_labelled_metrics(config: dict[str, Any]) -> None:
    """A tenant with per-minute limits, and metrics labelled by tenant behind a token."""
    config["tenants"].append(
        {"name": "paced", "keys": [PACED_KEY], "limits": {"requests_per_minute": 3, "tokens_per_minute": 100_000}}
    )
    config["metrics"] = {"tenant_labels": True, "token": METRICS_TOKEN}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir = tmp_path_factory.mktemp("refusal-metrics")
    yield from gateway_over_one_replica(log_dir, paced_tenant_and_labelled_metrics, "--time-scale", "0.02")


def samples(gateway: RunningProcess, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample of ``name`` by its labels."""
    page = httpx.get(gateway.url + "/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text
    found: dict[frozenset[tuple[str, str]], float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name:
                found[frozenset(sample.labels.items())] = sample.value
    return found


def refusals(gateway: RunningProcess, status: int, code: str, tenant: str) -> float:
    key = frozenset({"status": str(status), "code": code, "tenant": tenant}.items())
    return samples(gateway, "spillgate_refusals_total").get(key, 0.0)


def output_tokens(gateway: RunningProcess, pool: str, route: str) -> float:
    """The output tokens ``route`` took from ``pool``'s replicas."""
    found = samples(gateway, "spillgate_output_tokens_total")
    return sum(
        v for labels, v in found.items() if pool_of(dict(labels)["backend"]) == pool and ("route", route) in labels
    )


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("method", "path", "body", "key", "status", "code", "tenant"),
    [
        ("POST", CHAT, {"model": "chat", "messages": HELLO}, WRONG_KEY, 401, "invalid_api_key", ""),
        ("POST", CHAT, {"model": "chat", "messages": HELLO}, OTHER_KEY, 403, "model_not_allowed", "tenant-b"),
        ("POST", CHAT, {"model": "no-such-model", "messages": HELLO}, TENANT_KEY, 404, "model_not_found", "tenant-a"),
        ("POST", CHAT, {"model": "chat", "messages": []}, TENANT_KEY, 422, "invalid_value", "tenant-a"),
        ("POST", CHAT, b"[not json", TENANT_KEY, 400, "invalid_json", "tenant-a"),
        ("GET", "/v1/models", None, WRONG_KEY, 401, "invalid_api_key", ""),
        ("GET", "/v1/models/no-such-model", None, TENANT_KEY, 404, "model_not_found", "tenant-a"),
        ("GET", "/admin/config", None, TENANT_KEY, 403, "admin_key_required", "tenant-a"),
    ],
)
def test_each_refusal_raises_its_counter_by_one(
    gateway: RunningProcess, method: str, path: str, body: object, key: str, status: int, code: str, tenant: str
) -> None:
    before = refusals(gateway, status, code, tenant)
    content = body if isinstance(body, bytes) else None
    payload = None if isinstance(body, bytes) else body
    response = httpx.request(method, gateway.url + path, json=payload, content=content, headers=bearer(key))
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert refusals(gateway, status, code, tenant) == before + 1


def test_answers_from_a_backend_are_not_refusals(gateway: RunningProcess) -> None:
    before = sum(samples(gateway, "spillgate_refusals_total").values())
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    client.chat.completions.create(model="chat", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert sum(samples(gateway, "spillgate_refusals_total").values()) == before


def test_output_tokens_rise_by_the_completion_tokens_of_each_answer(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    before = output_tokens(gateway, "pool", "chat")
    answer = client.chat.completions.create(model="chat", messages=HELLO, max_tokens=7)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert output_tokens(gateway, "pool", "chat") == before + answer.usage.completion_tokens

    chunks = client.chat.completions.create(
        model="chat-rr", messages=HELLO, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[arg-type]
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None][-1]
    assert output_tokens(gateway, "pool", "chat-rr") >= usage.completion_tokens > 0


def test_a_tenant_with_rate_limits_is_told_where_it_stands(gateway: RunningProcess) -> None:
    body = {"model": "chat", "messages": HELLO, "max_tokens": 4}
    first = httpx.post(gateway.url + CHAT, json=body, headers=bearer(PACED_KEY), timeout=30)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert first.headers["x-ratelimit-limit-tokens"] == "100000"
    assert 0 < 100_000 - int(first.headers["x-ratelimit-remaining-tokens"]) < 1000

    stream = {**body, "stream": True}
    with httpx.stream("POST", gateway.url + CHAT, json=stream, headers=bearer(PACED_KEY), timeout=30) as streamed:
        assert streamed.status_code == 200
        assert streamed.headers["x-ratelimit-remaining-requests"] == "1"
        streamed.read()
    assert httpx.post(gateway.url + CHAT, json=body, headers=bearer(PACED_KEY), timeout=30).status_code == 200

    before = refusals(gateway, 429, "quota_exceeded", "paced")
    refused = httpx.post(gateway.url + CHAT, json=body, headers=bearer(PACED_KEY), timeout=30)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(refused.headers["retry-after"]) >= 1
    assert refusals(gateway, 429, "quota_exceeded", "paced") == before + 1


def test_a_tenant_without_limits_gets_no_rate_limit_headers(gateway: RunningProcess) -> None:
    body = {"model": "chat", "messages": HELLO, "max_tokens": 2}
    response = httpx.post(gateway.url + CHAT, json=body, headers=bearer(TENANT_KEY), timeout=30)
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("x-ratelimit-")]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.0, "0s"), (0.25, "250ms"), (0.0001, "1ms"), (8.64, "8.64s"), (20.0, "20s"), (90.5, "1m30.5s")],
)
def test_reset_durations_are_written_as_openai_writes_them(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown
