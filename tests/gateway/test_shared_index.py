"""Two gateway processes sharing the prefix index through a real Redis route alike."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway
from tests.support.procs import RunningProcess

AUTH = {"authorization": f"Bearer {TENANT_KEY}"}


def aware_config(replicas: list[RunningProcess], redis_url: str | None, key_prefix: str) -> dict:
    config = gateway_config([r.url for r in replicas])
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    config["pools"][0]["prefill_tokens_per_s"] = 1_000_000
    if redis_url:
        config["state"] = {"redis_url": redis_url, "key_prefix": key_prefix}
    return config


@pytest.fixture(scope="module")
def gateways(
    replicas: list[RunningProcess], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningProcess, RunningProcess, RunningProcess]]:
    log_dir = tmp_path_factory.mktemp("shared")
    key_prefix = f"test-{os.getpid()}-{time.time_ns()}"
    started = [
        start_gateway(aware_config(replicas, redis_url, key_prefix), log_dir),
        start_gateway(aware_config(replicas, redis_url, key_prefix), log_dir),
        start_gateway(aware_config(replicas, None, key_prefix), log_dir),
    ]
    yield started[0], started[1], started[2]
    for proc in started:
        proc.stop()


def ask(gateway: RunningProcess, group: int, question: str) -> httpx.Response:
    system = f"Shared index group {group}. " + " ".join(f"clause{group}-{i}." for i in range(400))
    body = {
        "model": "aware",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 1,
    }
    response = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response


def test_a_prefix_learned_by_one_process_routes_the_other(gateways) -> None:
    first, second, alone = gateways
    assert httpx.get(first.url + "/health").json()["redis"] == "connected"
    homes = {group: ask(first, group, "first").headers["x-spillgate-backend"] for group in range(3)}
    time.sleep(0.5)  # the stream carries the change to the other process within milliseconds
    for group, home in homes.items():
        response = ask(second, group, "second")
        assert response.headers["x-spillgate-reason"] == "prefix_hit"
        assert response.headers["x-spillgate-backend"] == home
        assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 300
    # The control: a process that does not share the index knows nothing of these prefixes.
    assert {ask(alone, group, "third").headers["x-spillgate-reason"] for group in homes} == {"least_ttft"}


def test_processes_sharing_redis_tell_each_other_their_load(gateways) -> None:
    first, second, alone = gateways

    def peers(gateway: RunningProcess) -> object:
        return httpx.get(gateway.url + "/health").json().get("peer_processes")

    deadline = time.monotonic() + 10
    while (peers(first), peers(second)) != (1, 1):
        assert time.monotonic() < deadline, "the two processes never counted each other"
        time.sleep(0.1)
    assert peers(alone) is None, "a process without Redis has no peers to hear from"
    backends = httpx.get(second.url + "/health").json()["backends"]
    assert all(b["peer_in_flight"] == 0 for b in backends.values()), "nothing is in flight anywhere"
