"""Prefix-cache-aware routing through the real gateway and simulated replicas."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, start_gateway, start_replica
from tests.support.procs import RunningProcess
from tests.support.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningProcess]]:
    """Replicas that run at most two requests at once, so a burst on one of them queues."""
    log_dir: Path = tmp_path_factory.mktemp("limited")
    started = [start_replica(log_dir, "--time-scale", "0.02", "--max-running-requests", "2") for _ in range(3)]
    yield started
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def aware(limited: list[RunningProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("aware")
    config = gateway_config([r.url for r in limited])
    # The simulated replicas run 50x faster than real time; so does their prefill rate.
    config["pools"][0]["prefill_tokens_per_s"] = 1_000_000
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    config["routes"].append({"name": "hashed", "targets": ["pool"], "policy": "consistent_hash"})
    gateway = start_gateway(config, log_dir)
    yield gateway
    gateway.stop()


def system_prompt(group: int) -> str:
    return f"Group {group} policy manual. " + " ".join(f"rule{group}-{i} applies." for i in range(500))


def ask(client: openai.OpenAI, model: str, group: int, question: str, max_tokens: int = 2):
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": system_prompt(group)}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
    )
    return raw.headers["x-spillgate-backend"], raw.headers["x-spillgate-reason"], raw.parse().usage


def test_requests_sharing_a_prefix_go_to_the_warm_replica(aware: RunningProcess) -> None:
    client = openai.OpenAI(base_url=aware.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    for group in range(4):
        first, _, usage = ask(client, "aware", group, "first question")
        assert usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens / 2
        for n in range(3):
            backend, reason, usage = ask(client, "aware", group, f"follow-up {n}")
            assert backend == first, f"{reason}; the gateway's view: {httpx.get(aware.url + '/health').text}"
            assert reason == "prefix_hit"
            assert usage.prompt_tokens_details.cached_tokens > 0.8 * usage.prompt_tokens


def test_groups_spread_over_replicas(aware: RunningProcess, limited: list[RunningProcess]) -> None:
    client = openai.OpenAI(base_url=aware.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    homes = {ask(client, "aware", 100 + group, "hello")[0] for group in range(6)}
    assert len(homes) == len(limited), "cold prefixes must not pile onto one replica"


def test_hot_prefix_spreads_when_its_replica_is_busy(aware: RunningProcess) -> None:
    client = openai.OpenAI(base_url=aware.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    ask(client, "aware", 200, "warm it up")
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda n: ask(client, "aware", 200, f"question {n}", max_tokens=64), range(12)))
    assert len({backend for backend, _, _ in results}) >= 2


def test_consistent_hash_is_sticky_per_prefix(aware: RunningProcess) -> None:
    client = openai.OpenAI(base_url=aware.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    for group in range(3):
        assert len({ask(client, "hashed", 300 + group, f"q{n}")[0] for n in range(3)}) == 1


def test_token_block_fingerprints_route_to_the_warm_replica(limited: list[RunningProcess], tmp_path: Path) -> None:
    config = gateway_config([r.url for r in limited])
    config["pools"][0]["prefill_tokens_per_s"] = 1_000_000
    config["prefix"] = {"tokenizer": str(train_tokenizer(tmp_path / "tokenizer.json")), "block_tokens": 32}
    config["routes"].append({"name": "aware", "targets": ["pool"], "policy": "cache_aware"})
    gateway = start_gateway(config, tmp_path)
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    try:
        first, _, _ = ask(client, "aware", 700, "first question")
        backend, reason, usage = ask(client, "aware", 700, "a follow-up")
        assert (backend, reason) == (first, "prefix_hit")
        assert usage.prompt_tokens_details.cached_tokens > 0.8 * usage.prompt_tokens
        predicted = next(
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(gateway.url + "/metrics").text.splitlines()
            if line.startswith("spillgate_prompt_tokens_total") and 'kind="predicted_cached"' in line
        )
        assert predicted >= 0.8 * usage.prompt_tokens, "the follow-up's prefix was predicted, in 32-token blocks"
    finally:
        gateway.stop()
