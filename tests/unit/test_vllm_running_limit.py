"""The vLLM adapter's running-request limit (``--max-num-seqs``), beside SGLang's in test_engine_fixtures.py.

vLLM 0.32 publishes it only at the development-mode ``/server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1``;
``vllm/entrypoints/serve/dev/server_info/api_router.py`` dumps ``VllmConfig`` with pydantic). The captured
fixtures are servers without dev mode, where it answers 404; the dev-mode bodies here carry the fields of that
dump the adapter reads (``scheduler_config``, ``parallel_config``), with the rest of each captured server's
answers served as they were."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from spillgate.backends.engines import engine_named
from tests.unit.test_engine_fixtures import served


def dev_mode(max_num_seqs: int, **parallel: Any) -> dict[str, Any]:
    """``/server_info?config_format=json`` as vLLM's dev mode answers it, cut to the parts the adapter reads."""
    parallel_config = {
        "data_parallel_size": 1,
        "data_parallel_size_local": 1,
        "data_parallel_external_lb": False,
        "data_parallel_hybrid_lb": False,
        "tensor_parallel_size": 1,
        **parallel,
    }
    return {
        "vllm_config": {
            "scheduler_config": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 2048, "policy": "fcfs"},
            "parallel_config": parallel_config,
            "cache_config": {"block_size": 128, "num_gpu_blocks": 512},
        },
        "vllm_env": {"VLLM_SERVER_DEV_MODE": True},
        "system_env": {},
    }


def with_server_info(profile: str, answer: httpx.Response | Exception):  # type: ignore[no-untyped-def]
    """The captured ``profile`` server, plus ``answer`` at the dev-mode ``/server_info``."""
    captured = served("vllm", profile)

    async def get(path: str) -> httpx.Response:
        if path == "/server_info?config_format=json":
            if isinstance(answer, Exception):
                raise answer
            return answer
        return await captured(path)

    return get


@pytest.mark.parametrize("profile", ["defaults", "recommended"])
async def test_without_dev_mode_the_limit_is_unknown_and_nothing_is_claimed_missing(profile: str) -> None:
    info = await engine_named("vllm").describe(served("vllm", profile), "tiny")
    assert info.max_running == 0 and info.max_total_tokens > 0
    assert not any("server_info" in m or "max-num-seqs" in m for m in info.missing)


@pytest.mark.parametrize(
    ("parallel", "expected"),
    [
        ({}, 128),
        ({"data_parallel_size": 4, "data_parallel_size_local": 4}, 512),
        ({"data_parallel_size": 4, "data_parallel_size_local": 1, "data_parallel_external_lb": True}, 128),
        ({"data_parallel_size": 4, "data_parallel_size_local": 2, "data_parallel_hybrid_lb": True}, 256),
    ],
    ids=["one-rank", "internal-lb", "external-lb", "hybrid-lb"],
)
async def test_dev_mode_gives_the_limit_per_rank_times_the_ranks_behind_this_server(
    parallel: dict[str, Any], expected: int
) -> None:
    request = httpx.Request("GET", "http://replica/server_info")
    get = with_server_info("recommended", httpx.Response(200, json=dev_mode(128, **parallel), request=request))
    info = await engine_named("vllm").describe(get, "tiny")
    assert info.max_running == expected
    assert info.capabilities()["max_running"] == expected
    assert info.context_window == 16384 and info.max_total_tokens > 0, "the rest is read as before"


async def test_the_text_format_or_a_slow_first_answer_leaves_the_limit_unknown_and_the_replica_described() -> None:
    request = httpx.Request("GET", "http://replica/server_info")
    text = httpx.Response(200, json={"vllm_config": "model='tiny', ...", "vllm_env": {}}, request=request)
    for answer in (text, httpx.ReadTimeout("collecting the environment", request=request)):
        info = await engine_named("vllm").describe(with_server_info("recommended", answer), "tiny")
        assert info.max_running == 0 and info.version == "0.32.0"
