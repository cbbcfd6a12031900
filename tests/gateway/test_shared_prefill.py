"""Requests sharing a new prefix: the first one sent computes it, the others wait and find it cached."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import (
    TENANT_KEY,
    gateway_config,
    hang_up_while_held,
    serve_one_slow_replica,
    start_gateway,
    start_replica,
    streamed_usage,
    words,
)
from tests.support.procs import RunningProcess


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    def add_route(config: dict[str, Any]) -> None:
        config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})

    yield from serve_one_slow_replica(tmp_path_factory.mktemp("shared-prefill"), add_route)


def prefill_waits(metrics: str) -> list[float]:
    """``spillgate_prefill_waits_total`` of each replica of the pool (here its one)."""
    prefix = 'spillgate_prefill_waits_total{backend="pool/'
    return [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)]


def stream(client: openai.OpenAI, system: str, question: str) -> tuple[int, int]:
    """Prompt and cached tokens of one streamed answer."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    usage = streamed_usage(client, "aware", messages)
    assert usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def test_a_request_waits_for_the_prefill_of_the_prefix_it_shares(gateway: RunningProcess) -> None:
    """Without the wait, both requests would reach the replica while it prefills the blocker, share its next
    batch, and both compute the new system prompt."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    system = "You answer for the shared-prefill team. " + words("rule", 1500)
    results: dict[str, tuple[int, int]] = {}

    def send(name: str, prompt: str, question: str) -> None:
        results[name] = stream(client, prompt, question)

    blocker = threading.Thread(target=send, args=("blocker", words("block", 2000), "go"))
    blocker.start()
    time.sleep(0.15)  # the replica is prefilling the blocker
    first = threading.Thread(target=send, args=("first", system, "first question"))
    first.start()
    time.sleep(0.1)  # the gateway has sent the first one on
    send("second", system, "second question")
    first.join()
    blocker.join()
    prompt, cached = results["second"]
    shared = results["first"][0] - results["first"][1]
    assert cached > 0.8 * shared, f"the second request found {cached} of the {shared} tokens the first computed"
    assert prompt - cached < 0.2 * prompt
    metrics = httpx.get(gateway.url + "/metrics").text
    assert prefill_waits(metrics) == [1.0]


def test_a_client_that_leaves_while_held_was_never_served(gateway: RunningProcess) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    system = "You answer for the impatient team. " + words("norm", 1500)
    blocker = threading.Thread(target=stream, args=(client, words("wall", 2000), "go"))
    blocker.start()
    time.sleep(0.15)
    first = threading.Thread(target=stream, args=(client, system, "first question"))
    first.start()
    time.sleep(0.1)
    # Held for the blocker's prefill:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "second question"}]
    hang_up_while_held(gateway, "aware", messages)
    first.join()
    blocker.join()
    metrics = httpx.get(gateway.url + "/metrics").text
    assert prefill_waits(metrics) == [2.0]
    assert 'backend="-",outcome="client_disconnected",reason="-",route="aware"} 1.0' in metrics


@pytest.fixture(scope="module")
def two_gateways(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningProcess, RunningProcess]]:
    """Two gateway processes sharing Redis in front of the same slow replica."""
    log_dir = tmp_path_factory.mktemp("shared-prefill-two")
    replica = start_replica(log_dir, "--preset", "llama-3.1-8b-h100", "--time-scale", "3")
    config = gateway_config([replica.url])
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    config["state"] = {"redis_url": redis_url, "key_prefix": f"test-{os.getpid()}-{time.time_ns()}"}
    gateways = [start_gateway(config, log_dir), start_gateway(config, log_dir)]
    try:
        yield gateways[0], gateways[1]
    finally:
        for gateway in gateways:
            gateway.stop()
        replica.stop()


def test_a_request_waits_for_the_prefill_another_process_sent(two_gateways) -> None:
    """The first request of a new prefix goes through one process, the second through the other: without the
    announcement, the second would join the first one's batch and compute the prefix again."""
    one, other = two_gateways
    clients = [openai.OpenAI(base_url=g.url + "/v1", api_key=TENANT_KEY, max_retries=0) for g in two_gateways]
    system = "You answer for the two-process team. " + words("tenet", 1500)
    results: dict[str, tuple[int, int]] = {}

    def send(name: str, client: openai.OpenAI, prompt: str, question: str) -> None:
        results[name] = stream(client, prompt, question)

    blocker = threading.Thread(target=send, args=("blocker", clients[0], words("dam", 2000), "go"))
    blocker.start()
    time.sleep(0.15)  # the replica is prefilling the blocker
    first = threading.Thread(target=send, args=("first", clients[0], system, "first question"))
    first.start()
    time.sleep(0.1)  # sent on by the first process, and announced to the other
    send("second", clients[1], system, "second question")
    first.join()
    blocker.join()
    cached = results["second"][1]
    shared = results["first"][0] - results["first"][1]
    assert cached > 0.8 * shared, f"the second request found {cached} of the {shared} tokens the first computed"
    assert prefill_waits(httpx.get(other.url + "/metrics").text) == [1.0]
    assert "spillgate_prefill_waits_total{" not in httpx.get(one.url + "/metrics").text
