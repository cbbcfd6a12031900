"""Preset arithmetic (KV bytes, pool size) and the step-time roofline."""

from __future__ import annotations

import pytest

from spillgate.backends.sim import timing
from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.presets import GIB, PRESETS, get_preset


def test_kv_bytes_per_token() -> None:
    assert get_preset("llama-3.1-8b-h100").model.kv_bytes_per_token == 131072  # 128 KiB
    big = get_preset("llama-3.1-70b-fp8-2xh100")
    assert big.model.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert big.kv_bytes_per_token_per_gpu == big.model.kv_bytes_per_token // 2


def test_max_total_num_tokens_from_gpu_memory() -> None:
    preset = get_preset("llama-3.1-8b-h100")
    expected = int((80 * GIB * 0.88 - 8.03e9 * 2) // 131072)
    assert preset.max_total_num_tokens() == expected
    assert 400_000 < expected < 500_000
    assert preset.max_total_num_tokens(max_total_tokens=1000) == 1000
    assert preset.max_total_num_tokens(max_total_tokens=1001, page_size=16) == 992
    assert 200_000 < get_preset("llama-3.1-70b-fp8-2xh100").max_total_num_tokens() < 300_000
    assert get_preset("tiny-test").max_total_num_tokens() == 8192


def test_unknown_preset_lists_names() -> None:
    with pytest.raises(ValueError, match="tiny-test"):
        get_preset("nope")


def test_decode_is_memory_bound_and_grows_with_context() -> None:
    preset = get_preset("llama-3.1-8b-h100")
    single = timing.decode_seconds(preset, 1, 1000)
    assert 0.005 < single < 0.009  # ~6.5 ms: 16 GB of weights at ~2.7 TB/s
    assert timing.decode_seconds(preset, 64, 64 * 2000) > single * 1.5
    assert timing.decode_seconds(preset, 2, 2000) == pytest.approx(single, rel=0.05)


def test_prefill_grows_with_uncached_tokens_only() -> None:
    preset = get_preset("llama-3.1-8b-h100")
    short = timing.prefill_seconds(preset, [(200, 0)])
    long = timing.prefill_seconds(preset, [(6000, 0)])
    cached = timing.prefill_seconds(preset, [(1, 5999)])
    assert long > 10 * short
    assert cached < 2 * short
    assert timing.prefill_seconds(preset, [(8000, 8000)]) > timing.prefill_seconds(preset, [(8000, 0)])


def test_tensor_parallel_preset_is_slower_per_step() -> None:
    small, big = get_preset("llama-3.1-8b-h100"), get_preset("llama-3.1-70b-fp8-2xh100")
    assert timing.decode_seconds(big, 1, 1000) > timing.decode_seconds(small, 1, 1000)


def test_replica_config_resolves_sglang_defaults() -> None:
    config = ReplicaConfig(preset="llama-3.1-8b-h100")
    assert config.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert config.resolved_chunked_prefill_size == 8192
    assert config.resolved_max_running_requests == 2048
    assert config.server_args()["page_size"] == 1
    assert ReplicaConfig(model_name="x").served_model_name == "x"
    assert set(PRESETS) >= {"llama-3.1-8b-h100", "llama-3.1-70b-fp8-2xh100", "tiny-test"}
