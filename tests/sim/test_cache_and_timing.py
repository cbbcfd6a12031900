"""Prefix caching, eviction, queueing and TTFT as a gateway observes them over HTTP."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import openai
import pytest

from tests.sim.conftest import StartReplica
from tests.sim.helpers import distinct_ids, generate, metric_samples, words
from tests.support.procs import RunningProcess


@pytest.fixture(scope="module")
def tiny(start_sim: StartReplica) -> RunningProcess:
    """An 8k-token KV pool, so a few prompts fill it."""
    return start_sim("sim-replica", "--preset", "tiny-test", "--time-scale", "0.05")


@pytest.fixture(scope="module")
def big(start_sim: StartReplica) -> RunningProcess:
    """Llama-3.1-70B FP8 on two H100s at half real time: slow prefill makes TTFT gaps large."""
    return start_sim("sim-replica", "--preset", "llama-3.1-70b-fp8-2xh100", "--time-scale", "0.5")


def _ttft(oai: openai.OpenAI, content: str) -> tuple[float, int, int]:
    """Client-side TTFT of a streamed chat, with the prompt and cached token counts."""
    started = time.perf_counter()
    stream = oai.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": content}],
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    first_content: float | None = None
    usage = None
    for chunk in stream:
        if first_content is None and chunk.choices and chunk.choices[0].delta.content:
            first_content = time.perf_counter() - started
        usage = chunk.usage or usage
    assert first_content is not None and usage is not None and usage.prompt_tokens_details is not None
    return first_content, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def test_repeated_long_prompt_is_cached_and_faster(big: RunningProcess) -> None:
    with openai.OpenAI(base_url=big.url + "/v1", api_key="x", max_retries=0, timeout=60.0) as oai:
        content = words(7000, seed=1)
        cold_ttft, prompt_tokens, cold_cached = _ttft(oai, content)
        warm_ttft, _, warm_cached = _ttft(oai, content)
    assert prompt_tokens > 7000
    assert cold_cached < 50
    assert warm_cached >= prompt_tokens - 2
    assert cold_ttft > 0.3  # ~1 s of simulated prefill at time-scale 0.5
    assert warm_ttft < cold_ttft / 3


def test_ttft_grows_with_uncached_prompt_length(big: RunningProcess) -> None:
    with httpx.Client(base_url=big.url, timeout=60.0) as client:
        short = generate(client, distinct_ids(200, seed=2), max_new_tokens=1)["meta_info"]
        long = generate(client, distinct_ids(6000, seed=3), max_new_tokens=1)["meta_info"]
    assert short["cached_tokens"] == 0 and long["cached_tokens"] == 0
    assert long["first_token_latency"] > 0.5
    assert long["first_token_latency"] > 5 * short["first_token_latency"]


def test_full_kv_pool_evicts_the_least_recently_used_prefix(tiny: RunningProcess) -> None:
    with httpx.Client(base_url=tiny.url, timeout=30.0) as client:
        assert client.post("/flush_cache").status_code == 200
        a, b, c = (distinct_ids(2800, seed=10 + i) for i in range(3))
        generate(client, a)
        generate(client, b)
        assert generate(client, a)["meta_info"]["cached_tokens"] == 2799  # a is now more recent than b
        generate(client, c)  # three ~2800-token prefixes do not fit in 8192 tokens: b goes
        assert generate(client, a)["meta_info"]["cached_tokens"] == 2799
        assert generate(client, b)["meta_info"]["cached_tokens"] == 0


def test_requests_queue_while_kv_is_full_and_complete(tiny: RunningProcess) -> None:
    prompts = [distinct_ids(2500, seed=20 + i) for i in range(6)]

    def run(prompt: list[int]) -> dict:
        with httpx.Client(base_url=tiny.url, timeout=60.0) as client:
            return generate(client, prompt, max_new_tokens=600)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(run, prompt) for prompt in prompts]
        max_queued = 0.0
        while not all(future.done() for future in futures):
            max_queued = max(max_queued, metric_samples(tiny.url)["sglang:num_queue_reqs"])
            time.sleep(0.01)
        results = [future.result() for future in futures]
    assert max_queued > 0
    assert all(result["meta_info"]["completion_tokens"] == 600 for result in results)
    assert max(result["meta_info"]["queue_time"] for result in results) > 1.0  # waited for others' decode
