"""What a plan starts from: the model, the GPU, the traffic, one measured operating point, and the presets.

Sizes are decimal (1 GB = 1e9 bytes) and parameter counts nominal (70B = 70e9), as on spec sheets, so the
figures match the ones written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


class PlanError(ValueError):
    """An input the plan cannot use; the message is one line naming the flag."""


@dataclass(frozen=True)
class ModelSpec:
    """What memory sizing needs from a decoder-only transformer."""

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    weight_dtype: str
    kv_dtype: str

    @property
    def weight_bytes(self) -> float:
        return self.params * DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values for every layer and KV head: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[self.kv_dtype]


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: memory (GB), HBM bandwidth (TB/s) and rental price (USD per GPU-hour)."""

    name: str
    memory_gb: float
    bandwidth_tbs: float
    price_per_hour: float | None


def _llama(name: str, params: float, layers: int, weight_dtype: str = "bf16") -> ModelSpec:
    return ModelSpec(name, params, layers, kv_heads=8, head_dim=128, weight_dtype=weight_dtype, kv_dtype="bf16")


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _llama("llama-3.1-8b", 8e9, 32),
        _llama("llama-3.1-70b", 70e9, 80),
        _llama("llama-3.1-70b-fp8", 70e9, 80, "fp8"),  # FP8 weights; the KV cache stays bf16 (SGLang's "auto")
        _llama("llama-3.1-405b", 405e9, 126),
        _llama("llama-3.1-405b-fp8", 405e9, 126, "fp8"),
    )
}

GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("h100-80gb", 80, 3.35, 3.0),  # $3/GPU-hour: an illustrative rental price, override with --gpu-price
        GpuSpec("h200-141gb", 141, 4.8, None),
        GpuSpec("a100-80gb", 80, 2.039, None),
    )
}


@dataclass(frozen=True)
class Traffic:
    """The request shape and how much of it arrives: peak, headroom over it, and the day's average."""

    input_tokens: int
    output_tokens: int
    peak_rps: float
    headroom: float
    avg_to_peak: float

    @property
    def tokens_per_request(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class HostedPrices:
    """A hosted API's list prices, USD per million tokens."""

    input_per_mtok: float
    output_per_mtok: float


@dataclass(frozen=True)
class BenchLevel:
    """The ``spillgate bench`` level an operating point was taken from, with what it measured."""

    path: str
    label: str
    percentile: str
    ttft_ms: float | None
    tpot_ms: float | None
    slo_ttft_ms: float
    slo_tpot_ms: float
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    interrupted: bool


@dataclass(frozen=True)
class OperatingPoint:
    """The highest-throughput load one replica sustains within the SLO, measured (not derived)."""

    concurrency: int
    output_tps: float
    mean_e2e_s: float | None = None
    bench: BenchLevel | None = None


@dataclass(frozen=True)
class PlanInputs:
    model: ModelSpec
    gpu: GpuSpec
    tp: int
    mem_fraction: float
    traffic: Traffic
    point: OperatingPoint
    hosted: HostedPrices | None = None
