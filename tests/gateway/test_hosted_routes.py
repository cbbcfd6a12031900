"""Hosted models through litellm behind the gateway: both wire formats, provider failures, fallback, keys."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, pool_of, start_gateway, start_replica
from tests.support.procs import RunningProcess, free_port, start_spillgate

PROVIDER_KEY = "sk-provider-secret-4242"
AUTH = {"authorization": f"Bearer {TENANT_KEY}"}
COMPLEX = (
    "Prove rigorously, step by step, that the sum of the first n odd numbers is n^2, then derive a closed form "
    "for the sum of squares and compare and contrast induction with a telescoping argument."
)


def start_hosted(log_dir: Path, *flags: str) -> RunningProcess:
    port = free_port()
    args = ["sim-hosted", "--port", str(port), "--ttft-ms", "20", "--tpot-ms", "2", "--model-name", "m", *flags]
    return start_spillgate(args, port=port, log_dir=log_dir)


def hosted_entry(name: str, model: str, api_base: str) -> dict:
    return {
        "name": name,
        "model": model,
        "api_base": api_base,
        "api_key": PROVIDER_KEY,
        "input_per_mtok": 3,
        "output_per_mtok": 15,
        "ttft_ms": 20,
        "tpot_ms": 2,
        "timeout_s": 2,
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir = tmp_path_factory.mktemp("hosted-routes")
    replica = start_replica(log_dir, "--time-scale", "0.02")
    healthy = start_hosted(log_dir)
    failing = start_hosted(log_dir, "--fail-500-every", "1")
    limited = start_hosted(log_dir, "--fail-429-every", "1", "--retry-after-s", "7")
    broken = start_hosted(log_dir, "--malformed-after-chunks", "3")
    locked = start_hosted(log_dir, "--api-key", "sk-not-the-gateways")
    config = gateway_config([replica.url])
    config["hosted_models"] = [
        hosted_entry("oai", "openai/m", healthy.url + "/v1"),
        hosted_entry("claude", "anthropic/m", healthy.url),
        hosted_entry("failing", "openai/m", failing.url + "/v1"),
        hosted_entry("limited", "openai/m", limited.url + "/v1"),
        hosted_entry("broken", "openai/m", broken.url + "/v1"),
        hosted_entry("locked", "openai/m", locked.url + "/v1"),
        hosted_entry("locked-claude", "anthropic/m", locked.url),
    ]
    config["routes"] += [
        {"name": "oai", "targets": ["oai"]},
        {"name": "claude", "targets": ["claude"]},
        {"name": "limited", "targets": ["limited"]},
        {"name": "broken", "targets": ["broken"]},
        {"name": "locked", "targets": ["locked"]},
        {"name": "locked-claude", "targets": ["locked-claude"]},
        {
            "name": "locked-then-pool",
            "targets": ["pool", "locked"],
            "policy": "cache_aware",
            "spill": {"complexity_threshold": 0.5},
        },
        {
            "name": "failover",
            "targets": ["pool", "failing"],
            "policy": "cache_aware",
            "spill": {"complexity_threshold": 0.5},
        },
    ]
    gateway = start_gateway(config, log_dir)
    yield gateway
    for proc in (gateway, healthy, failing, limited, broken, locked, replica):
        proc.stop()


@pytest.mark.parametrize("route", ["oai", "claude"])
def test_both_wire_formats_stream_and_not(setup: RunningProcess, route: str) -> None:
    client = openai.OpenAI(base_url=setup.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=route, messages=[{"role": "user", "content": "hello there"}], max_tokens=6
    )
    assert raw.headers["x-spillgate-backend"] == route
    reply = raw.parse()
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 6
    chunks = list(
        client.chat.completions.create(
            model=route,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [6]


def test_a_failing_provider_falls_back_to_the_replicas(setup: RunningProcess) -> None:
    body = {"model": "failover", "messages": [{"role": "user", "content": COMPLEX}], "max_tokens": 4}
    response = httpx.post(setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    headers = response.headers
    assert (pool_of(headers["x-spillgate-backend"]), headers["x-spillgate-reason"]) == ("pool", "fallback")


def test_rate_limits_reach_the_client_with_retry_after(setup: RunningProcess) -> None:
    body = {"model": "limited", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = httpx.post(setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "hosted_rate_limited"


@pytest.mark.parametrize("route", ["locked", "locked-claude"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_refusing_the_gateways_key_is_a_502_not_the_clients_401(
    setup: RunningProcess, route: str, stream: bool
) -> None:
    body = {"model": route, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    response = httpx.post(setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "hosted_auth"


def test_a_provider_refusing_the_gateways_key_falls_back(setup: RunningProcess) -> None:
    body = {"model": "locked-then-pool", "messages": [{"role": "user", "content": COMPLEX}], "max_tokens": 4}
    response = httpx.post(setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    headers = response.headers
    assert (pool_of(headers["x-spillgate-backend"]), headers["x-spillgate-reason"]) == ("pool", "fallback")


def test_a_broken_stream_ends_with_an_in_band_error(setup: RunningProcess) -> None:
    body = {"model": "broken", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    with httpx.stream("POST", setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert '"error"' in events[-1] and "hosted_malformed" in events[-1]


def test_provider_keys_never_leak(setup: RunningProcess) -> None:
    for route in ("limited", "broken", "failover"):
        body = {"model": route, "messages": [{"role": "user", "content": COMPLEX}], "max_tokens": 4}
        response = httpx.post(setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert PROVIDER_KEY not in response.text
    assert PROVIDER_KEY not in setup.log()
    assert PROVIDER_KEY not in httpx.get(setup.url + "/metrics").text
    assert PROVIDER_KEY not in httpx.get(setup.url + "/health").text


def test_hosted_latency_is_learned_from_streams(setup: RunningProcess) -> None:
    client = openai.OpenAI(base_url=setup.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    for _ in range(3):
        list(
            client.chat.completions.create(
                model="oai", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
            )
        )
    learned = httpx.get(setup.url + "/health").json()["backends"]["oai"]
    assert learned["ttft_ms"] != 20.0, "still the configured prior"


def spend_metric(gateway: RunningProcess, backend: str) -> float:
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("spillgate_spend_usd_total{") and f'backend="{backend}"' in line
    )


def test_a_stream_the_client_abandons_is_still_paid_for(setup: RunningProcess) -> None:
    # The provider bills what it generated before it noticed; the gateway, which never saw the usage, books
    # the worst case (the prompt and max_tokens), in the ledger and in the spend metric alike.
    spent_before = httpx.get(setup.url + "/v1/spend", headers=AUTH, timeout=10).json()["today"]
    metric_before = spend_metric(setup, "oai")
    body = {
        "model": "oai",
        "messages": [{"role": "user", "content": "tell me a long story " * 50}],
        "max_tokens": 2000,
        "stream": True,
    }
    with httpx.stream("POST", setup.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30) as response:
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 5:
                break  # and hang up: the stream had thousands of tokens to go
    worst_output_usd = 2000 * 15 / 1e6

    def booked() -> bool:
        today = httpx.get(setup.url + "/v1/spend", headers=AUTH, timeout=10).json()["today"]
        return today["requests"] == spent_before["requests"] + 1

    deadline = time.monotonic() + 10
    while not booked():
        assert time.monotonic() < deadline, "the abandoned stream was never booked"
        time.sleep(0.1)
    today = httpx.get(setup.url + "/v1/spend", headers=AUTH, timeout=10).json()["today"]
    assert today["usd"] - spent_before["usd"] >= worst_output_usd
    assert spend_metric(setup, "oai") - metric_before == pytest.approx(today["usd"] - spent_before["usd"])


def test_a_request_no_backend_of_the_route_may_ever_serve_is_a_400(setup: RunningProcess) -> None:
    # Hosted models take chat completions only: a completions request to a hosted-only route is the client's
    # to change, not an outage to retry (503 with Retry-After sends SDKs into retries).
    body = {"model": "oai", "prompt": "hi", "max_tokens": 4}
    response = httpx.post(setup.url + "/v1/completions", json=body, headers=AUTH, timeout=10)
    assert response.status_code == 400, response.text
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert error["code"] == "unservable_request" and "/v1/chat/completions only" in error["message"]
