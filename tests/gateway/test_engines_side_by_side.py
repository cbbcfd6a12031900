"""An SGLang pool and a vLLM pool behind one route: each read through its own engine adapter, both serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.gateway import TENANT_KEY, gateway_config, pool_of, start_gateway, start_replica, words
from tests.support.procs import RunningProcess

FAST = ("--time-scale", "0.05")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProcess]:
    log_dir: Path = tmp_path_factory.mktemp("mixed")
    sglang = start_replica(log_dir, *FAST)
    vllm = start_replica(log_dir, *FAST, "--engine", "vllm", "--enable-prompt-tokens-details", bare=True)
    config = gateway_config([])
    config["pools"] = [
        {"name": "sgl", "served_model": "sim-model", "engine": "sglang", "replicas": [sglang.url]},
        {"name": "vl", "served_model": "sim-model", "engine": "vllm", "replicas": [vllm.url]},
    ]
    config["routes"] = [{"name": "chat", "targets": ["sgl", "vl"], "policy": "cache_aware"}]
    config["tenants"] = config["tenants"][:1]
    gateway = start_gateway(config, log_dir)
    yield gateway
    for proc in (gateway, sglang, vllm):
        proc.stop()


def test_both_engines_serve_one_route_and_each_is_read_its_own_way(mixed: RunningProcess) -> None:
    client = openai.OpenAI(base_url=mixed.url + "/v1", api_key=TENANT_KEY, max_retries=0)
    homes = {}
    for group in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model="chat", messages=[{"role": "user", "content": words(f"g{group}-", 400)}], max_tokens=2
        )
        homes[group] = raw.headers["x-spillgate-backend"]
    assert {pool_of(home) for home in homes.values()} == {"sgl", "vl"}, "new prefixes spread over both pools"
    for group, home in homes.items():
        raw = client.chat.completions.with_raw_response.create(
            model="chat", messages=[{"role": "user", "content": words(f"g{group}-", 400) + " again"}], max_tokens=2
        )
        usage = raw.parse().usage
        assert raw.headers["x-spillgate-backend"] == home and raw.headers["x-spillgate-reason"] == "prefix_hit"
        # vLLM reports whole 16-token blocks, SGLang every token but the last.
        assert usage.prompt_tokens_details.cached_tokens > 0.8 * usage.prompt_tokens
        if pool_of(home) == "vl":
            assert usage.prompt_tokens_details.cached_tokens % 16 == 0
    by_pool = {pool_of(name): b for name, b in httpx.get(mixed.url + "/health").json()["backends"].items()}
    sgl, vl = by_pool["sgl"], by_pool["vl"]
    assert (sgl["engine"], vl["engine"]) == ("sglang", "vllm")
    assert sgl["capabilities"]["max_running"] and vl["capabilities"]["max_total_tokens"]
    assert sgl["degraded"] == vl["degraded"] == []
