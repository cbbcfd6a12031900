"""The replica's native SGLang routes over real HTTP."""

from __future__ import annotations

import json

import httpx

from tests.sim.helpers import distinct_ids, generate, metric_samples
from tests.support.procs import RunningProcess

METRIC_NAMES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:num_used_tokens",
    "sglang:gen_throughput",
    "sglang:max_total_num_tokens",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_requests_total",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:e2e_request_latency_seconds_bucket",
    "sglang:inter_token_latency_seconds_bucket",
    "sglang:request_time_per_output_token_seconds_bucket",
)


def test_health(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200


def test_server_and_model_info(client: httpx.Client) -> None:
    info = client.get("/get_server_info").json()
    assert 400_000 < info["max_total_num_tokens"] < 500_000
    assert info["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert info["tp_size"] == 1 and info["page_size"] == 1
    assert info["chunked_prefill_size"] == 8192
    assert info["max_running_requests"] is None, "null unless set by flag, as in SGLang"
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 2048
    assert info["version"] and info["internal_states"][0]["memory_usage"]["token_capacity"] > 0
    model = client.get("/get_model_info").json()
    assert model["model_path"] == info["model_path"] and model["is_generation"] is True
    assert client.get("/model_info").json() == model


def test_generate_meta_info(client: httpx.Client) -> None:
    body = generate(client, distinct_ids(300, seed=1), max_new_tokens=7, rid="gen-1")
    assert len(body["output_ids"]) == 7 and body["text"]
    meta = body["meta_info"]
    assert meta["id"] == "gen-1"
    assert meta["finish_reason"] == {"type": "length", "length": 7}
    assert meta["prompt_tokens"] == 300 and meta["completion_tokens"] == 7 and meta["cached_tokens"] == 0
    assert meta["e2e_latency"] >= meta["first_token_latency"] > 0

    text = client.post("/generate", json={"text": "The capital of France is", "sampling_params": {}}).json()
    assert 6 <= text["meta_info"]["prompt_tokens"] <= 10  # <|begin_of_text|> + ~4 characters a token
    assert 1 <= text["meta_info"]["completion_tokens"] <= 128  # SGLang's default max_new_tokens


def test_generate_stream_sends_cumulative_chunks(client: httpx.Client) -> None:
    body = {"input_ids": distinct_ids(50, seed=2), "sampling_params": {"max_new_tokens": 5}, "stream": True}
    with client.stream("POST", "/generate", json=body) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert [len(chunk["output_ids"]) for chunk in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["text"].startswith(chunks[0]["text"])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(chunk["meta_info"]["finish_reason"] is None for chunk in chunks[:-1])


def test_generate_errors(client: httpx.Client) -> None:
    missing = client.post("/generate", json={"sampling_params": {"max_new_tokens": 1}})
    assert missing.status_code == 400 and "error" in missing.json()
    malformed = client.post("/generate", content=b"[1, 2", headers={"content-type": "application/json"})
    assert malformed.status_code == 400
    bad_limit = client.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": -3}})
    assert bad_limit.status_code == 400


def test_cache_salts_keep_namespaces_apart(client: httpx.Client) -> None:
    prompt = distinct_ids(400, seed=3)
    assert generate(client, prompt, cache_salt="tenant-a")["meta_info"]["cached_tokens"] == 0
    assert generate(client, prompt, cache_salt="tenant-a")["meta_info"]["cached_tokens"] == 399
    assert generate(client, prompt, cache_salt="tenant-b")["meta_info"]["cached_tokens"] == 0
    assert generate(client, prompt)["meta_info"]["cached_tokens"] == 0
    assert generate(client, prompt)["meta_info"]["cached_tokens"] == 399


def test_flush_cache_empties_the_cache(client: httpx.Client) -> None:
    prompt = distinct_ids(200, seed=4)
    generate(client, prompt)
    assert generate(client, prompt)["meta_info"]["cached_tokens"] == 199
    flushed = client.post("/flush_cache")
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.")
    assert generate(client, prompt)["meta_info"]["cached_tokens"] == 0


def test_metrics_use_sglang_names_and_labels(replica: RunningProcess, client: httpx.Client) -> None:
    prompt = distinct_ids(100, seed=5)
    generate(client, prompt)
    generate(client, prompt)
    samples = metric_samples(replica.url)
    missing = [name for name in METRIC_NAMES if name not in samples]
    assert not missing
    assert samples["sglang:num_requests_total"] >= 2
    assert samples["sglang:cached_tokens_total"] >= 99
    text = client.get("/metrics").text
    assert 'sglang:num_running_reqs{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct"' in text
    assert 'is_streaming="false"' in text


def test_load_endpoints(client: httpx.Client) -> None:
    legacy = client.get("/get_load").json()
    assert legacy[0].keys() >= {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    loads = client.get("/v1/loads").json()
    load = loads["loads"][0]
    assert load["max_total_num_tokens"] > 0 and load["num_running_reqs"] == 0
    assert load["memory"]["token_capacity"] == load["max_total_num_tokens"]
