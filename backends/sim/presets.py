"""Model and GPU figures the simulator derives its KV capacity and step times from.

Every number a simulated replica reports (KV capacity, TTFT, TPOT) comes from a preset, so the
figures are written out here in one place, with the arithmetic SGLang uses to size its KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as memory and FLOPs are concerned."""

    hf_name: str
    architecture: str
    model_type: str
    num_params: float
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    weight_bytes_per_param: float
    kv_bytes_per_value: int
    context_length: int

    @property
    def hidden_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, for every layer and KV head: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_value

    @property
    def weight_bytes(self) -> int:
        return int(self.num_params * self.weight_bytes_per_param)


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: memory capacity, HBM bandwidth and dense bf16 peak."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    peak_flops: float


@dataclass(frozen=True)
class Efficiency:
    """How close to the hardware peaks the serving stack gets; tuned to public H100 numbers."""

    hbm: float = 0.80
    prefill_mfu: float = 0.55
    attention_mfu: float = 0.35
    decode_mfu: float = 0.50
    decode_overhead_s: float = 0.0004
    prefill_overhead_s: float = 0.002
    allreduce_latency_s: float = 8e-6


@dataclass(frozen=True)
class Preset:
    """A model served on a number of GPUs with tensor parallelism."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    tp_size: int = 1
    efficiency: Efficiency = Efficiency()
    max_total_tokens: int | None = None
    context_length: int | None = None

    @property
    def served_context_length(self) -> int:
        return self.context_length or self.model.context_length

    @property
    def weight_bytes_per_gpu(self) -> int:
        return self.model.weight_bytes // self.tp_size

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """Tensor parallelism splits KV heads across GPUs, so each GPU holds 1/tp of every token."""
        return self.model.kv_bytes_per_token // self.tp_size

    def default_mem_fraction_static(self) -> float:
        """SGLang's long-standing default: the share of GPU memory for weights plus the KV pool."""
        if self.tp_size >= 16:
            return 0.79
        if self.tp_size >= 8:
            return 0.81
        if self.tp_size >= 4:
            return 0.85
        if self.tp_size >= 2:
            return 0.87
        return 0.88

    def default_chunked_prefill_size(self) -> int:
        """SGLang picks 2k/4k/8k/16k by GPU memory; 8192 for 80 GB H100s."""
        memory_mib = self.gpu.memory_bytes >> 20
        if memory_mib < 20 * 1024:
            return 2048
        if memory_mib < 60 * 1024:
            return 4096
        if memory_mib < 160 * 1024:
            return 8192
        return 16384

    def max_total_num_tokens(
        self,
        *,
        mem_fraction_static: float | None = None,
        max_total_tokens: int | None = None,
        page_size: int = 1,
    ) -> int:
        """KV pool capacity in tokens: (GPU memory x mem_fraction_static - weights) / KV bytes per token.

        ``max_total_tokens`` (the --max-total-tokens flag) replaces the preset's own cap.
        """
        fraction = mem_fraction_static or self.default_mem_fraction_static()
        kv_bytes = self.gpu.memory_bytes * fraction - self.weight_bytes_per_gpu
        tokens = int(kv_bytes // self.kv_bytes_per_token_per_gpu)
        cap = max_total_tokens if max_total_tokens is not None else self.max_total_tokens
        if cap is not None:
            tokens = min(tokens, cap)  # like SGLang's --max-total-tokens: it can only shrink the pool
        return max(page_size, tokens // page_size * page_size)


H100_SXM = GpuSpec(name="NVIDIA H100 80GB HBM3", memory_bytes=80 * GIB, hbm_bytes_per_s=3.35e12, peak_flops=989e12)

LLAMA_31_8B = ModelSpec(
    hf_name="meta-llama/Llama-3.1-8B-Instruct",
    architecture="LlamaForCausalLM",
    model_type="llama",
    num_params=8.03e9,
    num_layers=32,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    weight_bytes_per_param=2,
    kv_bytes_per_value=2,
    context_length=131072,
)

LLAMA_31_70B_FP8 = ModelSpec(
    hf_name="meta-llama/Llama-3.1-70B-Instruct-FP8",
    architecture="LlamaForCausalLM",
    model_type="llama",
    num_params=70.6e9,
    num_layers=80,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    weight_bytes_per_param=1,  # FP8 weights
    kv_bytes_per_value=2,  # the KV cache stays bf16 (SGLang's kv_cache_dtype "auto")
    context_length=131072,
)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(name="llama-3.1-8b-h100", model=LLAMA_31_8B, gpu=H100_SXM),
        Preset(name="llama-3.1-70b-fp8-2xh100", model=LLAMA_31_70B_FP8, gpu=H100_SXM, tp_size=2),
        # Llama-3.1-8B speeds with an 8k-token KV pool, so tests can fill and evict it quickly.
        Preset(
            name="tiny-test",
            model=LLAMA_31_8B,
            gpu=H100_SXM,
            max_total_tokens=8192,
            context_length=8192,
        ),
    )
}


def get_preset(name: str) -> Preset:
    """Look a preset up by name; the error lists the valid names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}") from None
