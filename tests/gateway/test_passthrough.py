"""Fields the gateway does not use reach SGLang untouched, and per-backend latencies are measured."""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from spillgate.backends.sim import timing
from spillgate.backends.sim.presets import get_preset
from tests.support.gateway import TENANT_KEY, gateway_config, replica_name, start_gateway, start_replica
from tests.support.procs import RunningProcess

LONG_SYSTEM = "You answer questions about the shipping manual. " * 60


@pytest.fixture(scope="module")
def single_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    replica = start_replica(tmp_path_factory.mktemp("single-replica"), "--time-scale", "0.02")
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def single(single_replica: RunningProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    """A gateway over one replica, so that cache effects are not spread by routing."""
    gateway = start_gateway(gateway_config([single_replica.url]), tmp_path_factory.mktemp("single"))
    yield gateway
    gateway.stop()


def cached_tokens(client: openai.OpenAI, question: str, salt: str | None) -> int:
    extra = {"cache_salt": salt} if salt else {}
    reply = client.chat.completions.create(
        model="chat",
        messages=[{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}],
        max_tokens=2,
        extra_body=extra,
    )
    return reply.usage.prompt_tokens_details.cached_tokens


def test_cache_salt_reaches_the_replica(single: RunningProcess) -> None:
    client = openai.OpenAI(base_url=single.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    assert cached_tokens(client, "Where is my parcel?", "team-red") == 0
    warm = cached_tokens(client, "When does it ship?", "team-red")
    assert warm > 400, "the same salt shares the system prompt's cache"
    assert cached_tokens(client, "Where is my parcel?", "team-blue") == 0, "another salt shares nothing"


def test_latencies_are_measured_per_backend(single: RunningProcess, single_replica: RunningProcess) -> None:
    backend = replica_name(single_replica)
    client = openai.OpenAI(base_url=single.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    list(
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=16, stream=True
        )
    )
    metrics = httpx.get(single.url + "/metrics").text
    for name in ("spillgate_ttft_seconds_count", "spillgate_tpot_seconds_count", "spillgate_e2e_seconds_count"):
        line = next(line for line in metrics.splitlines() if line.startswith(name + f'{{backend="{backend}"}}'))
        assert float(line.rsplit(" ", 1)[1]) >= 1
    assert f'spillgate_requests_total{{backend="{backend}",outcome="ok",reason="least_load",route="chat"}}' in metrics
    assert f'spillgate_prompt_tokens_total{{backend="{backend}",kind="prompt"}}' in metrics
    assert f'spillgate_prompt_tokens_total{{backend="{backend}",kind="cached"}}' in metrics


def test_prefill_rate_is_learned_from_observed_ttfts(single: RunningProcess, single_replica: RunningProcess) -> None:
    """The replica runs 50x faster than real time; the gateway must find that out by itself."""
    client = openai.OpenAI(base_url=single.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    for n in range(12):
        prompt = f"variant {n} " + "lorem ipsum dolor " * (100 + 250 * n)
        list(
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": prompt}], max_tokens=2, stream=True
            )
        )
    learned = httpx.get(single.url + "/health").json()["backends"][replica_name(single_replica)]["prefill_tokens_per_s"]
    assert learned > 100_000, f"still near the 20,000 tokens/s prior: {learned}"


def test_prefill_rate_is_learned_while_the_replica_is_never_idle(tmp_path: Path) -> None:
    """Under steady load a replica is seldom idle: the rate must be learned from requests that queued too."""
    replica = start_replica(tmp_path, "--time-scale", "0.02")
    gateway = start_gateway(gateway_config([replica.url]), tmp_path)
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)

        def ask(n: int) -> None:
            prompt = f"busy {n} " + "lorem ipsum dolor " * (100 + 150 * (n % 12))
            stream = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": prompt}], max_tokens=8, stream=True
            )
            list(stream)

        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(ask, range(36)))
        learned = httpx.get(gateway.url + "/health").json()["backends"][replica_name(replica)]["prefill_tokens_per_s"]
        assert learned > 100_000, f"still near the 20,000 tokens/s prior: {learned}"
    finally:
        gateway.stop()
        replica.stop()


def test_under_a_queue_the_learned_rate_is_how_fast_the_replica_drains_it(tmp_path: Path) -> None:
    """Eight prompts at once, again and again: what routing and spilling predict a queue's wait from must be the
    replica's own prefill speed, taken from its timing model (each 3-letter word is one token to the simulator's
    tokenizer and to the gateway's estimate alike), and ``spillgate_ttft_prediction_ratio`` shows how close the
    predictions came."""
    rng = random.Random(4)
    replica = start_replica(tmp_path, "--preset", "llama-3.1-8b-h100", "--time-scale", "3")
    gateway = start_gateway(gateway_config([replica.url]), tmp_path)
    try:
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=TENANT_KEY, max_retries=0)
        prompts = [" ".join("".join(rng.choices(string.ascii_lowercase, k=3)) for _ in range(1000)) for _ in range(32)]

        streamed: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 2}

        def ask(prompt: str) -> int:
            """The prompt tokens the replica counted."""
            asked = [{"role": "user", "content": prompt}]
            chunks = client.chat.completions.create(model="chat", messages=asked, **streamed)
            return next(chunk.usage.prompt_tokens for chunk in chunks if chunk.usage)

        with ThreadPoolExecutor(max_workers=8) as pool:
            prompt_tokens = list(pool.map(ask, prompts))
        learned = httpx.get(gateway.url + "/health").json()["backends"][replica_name(replica)]["prefill_tokens_per_s"]
        ratios = prediction_ratios(httpx.get(gateway.url + "/metrics").text, replica_name(replica))
    finally:
        gateway.stop()
        replica.stop()
    preset = get_preset("llama-3.1-8b-h100")
    wall_s = sum(3 * timing.prefill_seconds(preset, [(tokens, 0)]) for tokens in prompt_tokens)
    drains = sum(prompt_tokens) / wall_s
    assert 0.75 * drains < learned < 1.15 * drains, f"learned {learned:.0f} tokens/s; the replica drains {drains:.0f}"
    # Every request's TTFT was judged against its prediction; once learned (the first few run on the prior),
    # most were within -20% / +50% of it.
    assert ratios["+Inf"] == len(prompts)
    assert ratios["1.5"] - ratios["0.8"] >= len(prompts) / 2, ratios


def prediction_ratios(metrics: str, backend: str) -> dict[str, float]:
    """``spillgate_ttft_prediction_ratio`` for ``backend``: cumulative bucket counts by upper bound, and the count."""
    prefix = f'spillgate_ttft_prediction_ratio_bucket{{backend="{backend}",le="'
    buckets = {}
    for line in metrics.splitlines():
        if line.startswith(prefix):
            bound, value = line.removeprefix(prefix).split('"} ')
            buckets[bound] = float(value)
    return buckets
