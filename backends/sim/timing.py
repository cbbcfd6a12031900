"""How long one forward pass takes on the simulated hardware (a roofline, not a profile).

Decode is memory bound: every step streams the weights plus the running batch's KV from HBM.
Prefill is compute bound: 2 FLOPs per parameter per new token plus attention, which grows with
the context each new token attends to. Cached prefix tokens are not recomputed, but new tokens
still attend to them.
"""

from __future__ import annotations

from collections.abc import Iterable

from spillgate.backends.sim.presets import Preset


def _allreduce_seconds(preset: Preset) -> float:
    """Two all-reduces per layer (attention and MLP) when tensor parallel."""
    if preset.tp_size == 1:
        return 0.0
    return 2 * preset.model.num_layers * preset.efficiency.allreduce_latency_s


def _weight_read_seconds(preset: Preset) -> float:
    return preset.weight_bytes_per_gpu / (preset.gpu.hbm_bytes_per_s * preset.efficiency.hbm)


def decode_seconds(preset: Preset, batch_size: int, context_tokens: int) -> float:
    """One decode step for ``batch_size`` sequences holding ``context_tokens`` tokens of KV in total."""
    if batch_size <= 0:
        return 0.0
    eff = preset.efficiency
    bytes_read = preset.weight_bytes_per_gpu + preset.kv_bytes_per_token_per_gpu * context_tokens
    memory_s = bytes_read / (preset.gpu.hbm_bytes_per_s * eff.hbm)
    compute_s = 2 * preset.model.num_params * batch_size / preset.tp_size / (preset.gpu.peak_flops * eff.decode_mfu)
    return max(memory_s, compute_s) + eff.decode_overhead_s + _allreduce_seconds(preset)


def prefill_seconds(preset: Preset, chunks: Iterable[tuple[int, int]]) -> float:
    """One prefill (extend) step; ``chunks`` holds (new tokens, tokens already in KV) per request."""
    new_tokens = 0
    attention_pairs = 0.0
    for extend, prefix in chunks:
        new_tokens += extend
        attention_pairs += extend * prefix + extend * extend / 2
    if new_tokens == 0:
        return 0.0
    eff = preset.efficiency
    return (
        max(_prefill_flops_seconds(preset, new_tokens, attention_pairs), _weight_read_seconds(preset))
        + eff.prefill_overhead_s
        + _allreduce_seconds(preset)
    )


def prefill_compute_seconds(preset: Preset, extend: int, prefix: int) -> float:
    """The compute alone of prefilling ``extend`` new tokens after ``prefix`` cached ones: no floor, no overhead.

    What a prefill costs at the least, for references that must not be beaten by batching or scheduling.
    """
    return _prefill_flops_seconds(preset, extend, extend * prefix + extend * extend / 2)


def _prefill_flops_seconds(preset: Preset, new_tokens: int, attention_pairs: float) -> float:
    """The linear layers over ``new_tokens`` plus attention over ``attention_pairs`` (query, key) pairs."""
    eff = preset.efficiency
    model = preset.model
    peak = preset.gpu.peak_flops * preset.tp_size
    linear_s = 2 * model.num_params * new_tokens / (peak * eff.prefill_mfu)
    attention_flops = 4 * model.hidden_size * model.num_layers * attention_pairs
    return linear_s + attention_flops / (peak * eff.attention_mfu)
