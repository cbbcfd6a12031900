"""Each engine adapter read against what real SGLang and vLLM servers answered (``tests/fixtures``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from spillgate.backends.backend import Backend
from spillgate.backends.engines import engine_named

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(engine: str, profile: str, name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / engine / profile / f"{name}.json").read_text())


def served(engine: str, profile: str):  # type: ignore[no-untyped-def]
    """A ``get`` that answers each path as the captured server did."""
    records = {}
    for path in (FIXTURES / engine / profile).glob("*.json"):
        record = json.loads(path.read_text())
        request = record.get("request", {})
        if request.get("method") == "GET" and "no_api_key" not in path.stem:
            records.setdefault(request["path"], record)

    async def get(path: str) -> httpx.Response:
        record = records.get(path)
        request = httpx.Request("GET", "http://replica" + path)
        if record is None:
            return httpx.Response(404, json={"detail": "Not Found"}, request=request)
        if "text" in record:
            return httpx.Response(record["status"], text=record["text"], request=request)
        return httpx.Response(record["status"], json=record.get("body"), request=request)

    return get


async def test_sglang_recommended_flags_give_every_signal() -> None:
    info = await engine_named("sglang").describe(served("sglang", "recommended"), "tiny")
    assert info.metrics and info.cache_report and info.overlap_schedule
    assert info.max_running == 2048, "the effective limit from internal_states, the flag being null"
    assert (info.max_total_tokens, info.prefill_batch_tokens, info.context_window) == (65536, 4096, 16384)
    assert info.version == "0.5.23" and info.missing == ()


async def test_sglang_defaults_say_which_flags_are_missing() -> None:
    info = await engine_named("sglang").describe(served("sglang", "defaults"), "tiny")
    assert not info.metrics and not info.cache_report
    assert info.max_running == 2048
    assert any("--enable-metrics" in m for m in info.missing)
    assert any("--enable-cache-report" in m for m in info.missing)


def test_sglang_load_busy_and_after() -> None:
    sglang = engine_named("sglang")
    busy = sglang.parse_load(fixture("sglang", "recommended", "metrics_busy")["text"])
    assert busy.running >= 1 and busy.queued == 0 and 0 < busy.token_usage < 1
    assert busy.prompt_tokens_total > 0
    after = sglang.parse_load(fixture("sglang", "recommended", "metrics_after")["text"])
    assert after.running == 0, "SGLang republishes its gauges as it goes idle"


async def test_vllm_reads_capacity_and_context() -> None:
    info = await engine_named("vllm").describe(served("vllm", "recommended"), "tiny")
    labels = fixture("vllm", "recommended", "metrics_idle")["text"]
    assert info.context_window == 16384 and info.version == "0.32.0" and info.metrics
    assert info.max_total_tokens > 0 and f'num_gpu_blocks="{info.max_total_tokens // 128}"' in labels
    assert info.cache_report is None, "vLLM does not say at start-up; the first response does"


def test_vllm_load_busy() -> None:
    busy = engine_named("vllm").parse_load(fixture("vllm", "recommended", "metrics_busy")["text"])
    assert busy.running >= 1 and busy.running + busy.queued == 3 and 0 < busy.token_usage < 1
    assert 0 < busy.cache_hit_rate < 1 and busy.prompt_tokens_total > 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize(
    "name", ["error_context_too_long", "error_bad_temperature", "error_bad_max_tokens", "error_output_too_long"]
)
def test_engine_error_messages_are_read_without_server_internals(engine: str, name: str) -> None:
    record = fixture(engine, "recommended", name)
    message, _ = engine_named(engine).error_message(record["body"])
    assert message and 'File "' not in message and "site-packages" not in message


async def test_whether_vllm_reports_cached_tokens_is_learned_from_its_answers() -> None:
    vllm = engine_named("vllm")
    backend = Backend("v", "replica", "http://127.0.0.1:1", "tiny", engine=vllm)
    backend.info = await vllm.describe(served("vllm", "defaults"), "tiny")
    backend.observe_usage(fixture("vllm", "defaults", "chat_cold")["body"]["usage"])
    assert backend.info.cache_report is False
    assert any("--enable-prompt-tokens-details" in m for m in backend.info.missing)
    backend.observe_usage(fixture("vllm", "recommended", "chat_warm")["body"]["usage"])
    assert backend.info.cache_report is True and backend.info.missing == ()


def test_sglang_health_takes_a_second_and_vllms_answers_at_once() -> None:
    """Why the gateway's liveness check is SGLang's /ready, and vLLM's /health."""
    for profile in ("defaults", "recommended"):
        for name in ("health", "health_busy"):
            assert fixture("sglang", profile, name)["seconds"] >= 1.0
        assert fixture("sglang", profile, "ready")["seconds"] < 1.0
        assert fixture("vllm", profile, "health")["seconds"] < 1.0
        assert fixture("vllm", profile, "ready")["status"] == 404
    assert engine_named("sglang").liveness_path == "/ready" and engine_named("vllm").liveness_path == "/health"
