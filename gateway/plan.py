"""``spillgate plan``: the GPU capacity estimate an engineer would otherwise do by hand.

From a model, a GPU, a request shape, peak traffic and one measured operating point (the concurrency and
output tokens/s a replica sustains within the latency SLO, given or read from a ``spillgate bench`` JSON),
it derives the KV cache per token and per replica, the memory-bound concurrency, requests/s per replica,
replicas and GPUs for the peak with headroom, their cost per day, what a hosted API would charge for the same
traffic, and a Little's-law check of the operating point.

Sizes are decimal (1 GB = 1e9 bytes) and parameter counts nominal (70B = 70e9), as on spec sheets and in a
back-of-the-envelope estimate, so the figures match the ones written by hand.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

import orjson

JSON_VERSION = 1
GB = 1e9
SECONDS_PER_DAY = 86_400
HOURS_PER_DAY = 24
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
SLO_PERCENTILES = ("p50", "p95", "p99")
MAX_BENCH_ERROR_RATE = 0.01
"""A bench level with more failed requests than this does not count as meeting the SLO."""
LITTLE_TOLERANCE = 0.10
"""Little's law holds when the measured mean request duration predicts the throughput within this much."""
SHAPE_TOLERANCE = 0.10
"""Warn when the bench's mean output tokens differ from the planned request shape by more than this."""


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


@dataclass(frozen=True)
class Memory:
    """One replica's memory: what the weights leave for the KV cache and how many requests that holds."""

    weight_bytes: float
    usable_bytes: float
    kv_bytes_per_token: float
    kv_capacity_bytes: float
    kv_capacity_tokens: int
    kv_bytes_per_request: float
    concurrency: int


@dataclass(frozen=True)
class Fleet:
    rps_per_replica: float
    required_rps: float
    replicas: int
    gpus: int
    cost_per_day: float | None
    """USD per day for every GPU around the clock; ``None`` without a GPU price."""


@dataclass(frozen=True)
class Hosted:
    """The same average traffic sent to a hosted API instead."""

    avg_rps: float
    requests_per_day: float
    input_tokens_per_day: float
    output_tokens_per_day: float
    cost_per_day: float


@dataclass(frozen=True)
class Little:
    """Little's law, L = lambda x W, at the operating point: the request duration the figures imply."""

    implied_request_s: float
    implied_ms_per_output_token: float
    measured_request_s: float | None
    measured_rps: float | None
    deviation_pct: float | None
    consistent: bool | None


@dataclass(frozen=True)
class Decode:
    """HBM bounds on decode: one request alone, and the whole batch at the operating concurrency."""

    single_request_max_tps: float
    min_tpot_ms: float
    batch_ceiling_tps: float
    per_request_tps: float
    ceiling_used_pct: float


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    memory: Memory
    fleet: Fleet
    hosted: Hosted | None
    little: Little
    decode: Decode
    warnings: tuple[str, ...]


# Arithmetic: pure functions of validated inputs; the CLI at the bottom only parses, checks and prints. -----


def ceil_count(value: float) -> int:
    """Round a count up, ignoring float noise: 38 / 3.8 is 10.000000000000002 and needs 10, not 11.

    ``OverflowError`` when ``value`` is not finite (inputs so large the arithmetic overflowed)."""
    if not math.isfinite(value):
        raise OverflowError(value)
    return math.ceil(round(value, 9))


def floor_count(value: float) -> int:
    """Round a count down, ignoring float noise the other way."""
    return math.floor(round(value, 9))


def memory(model: ModelSpec, gpu: GpuSpec, tp: int, mem_fraction: float, traffic: Traffic) -> Memory:
    """KV capacity is what the usable memory of all ``tp`` GPUs leaves after the weights; a request holds the
    KV of its input and output tokens, so capacity / per-request KV is the most requests memory allows."""
    usable = tp * gpu.memory_gb * GB * mem_fraction
    capacity = usable - model.weight_bytes
    if capacity <= 0:
        raise PlanError(
            f"the weights ({_gb(model.weight_bytes)}) do not fit in {_gb(usable)} usable "
            f"({_pct(mem_fraction)} of {tp} x {gpu.memory_gb:g} GB): raise --tp or use smaller weights"
        )
    per_token = model.kv_bytes_per_token
    per_request = traffic.tokens_per_request * per_token
    concurrency = floor_count(capacity / per_request)
    if concurrency < 1:
        raise PlanError(
            f"one request's KV cache ({_gb(per_request)}) does not fit in the {_gb(capacity)} the weights leave: "
            "raise --tp or shorten the request"
        )
    return Memory(
        weight_bytes=model.weight_bytes,
        usable_bytes=usable,
        kv_bytes_per_token=per_token,
        kv_capacity_bytes=capacity,
        kv_capacity_tokens=floor_count(capacity / per_token),
        kv_bytes_per_request=per_request,
        concurrency=concurrency,
    )


def fleet(point: OperatingPoint, traffic: Traffic, gpu: GpuSpec, tp: int) -> Fleet:
    """Replicas = peak x (1 + headroom) / RPS per replica, rounded up once at the end (rounding the bare peak up
    first and then adding headroom would overprovision)."""
    rps = point.output_tps / traffic.output_tokens
    required = traffic.peak_rps * (1 + traffic.headroom)
    replicas = ceil_count(required / rps)
    gpus = replicas * tp
    cost = None if gpu.price_per_hour is None else gpus * gpu.price_per_hour * HOURS_PER_DAY
    return Fleet(rps, required, replicas, gpus, cost_per_day=cost)


def hosted(traffic: Traffic, prices: HostedPrices) -> Hosted:
    """Hosted APIs bill tokens, so they see the day's average traffic, not the provisioned peak."""
    avg_rps = traffic.peak_rps * traffic.avg_to_peak
    requests = avg_rps * SECONDS_PER_DAY
    input_tokens = requests * traffic.input_tokens
    output_tokens = requests * traffic.output_tokens
    cost = (input_tokens * prices.input_per_mtok + output_tokens * prices.output_per_mtok) / 1e6
    return Hosted(avg_rps, requests, input_tokens, output_tokens, cost)


def little(point: OperatingPoint, rps_per_replica: float, output_tokens: int) -> Little:
    """L = lambda x W: ``concurrency`` requests in flight at ``rps_per_replica`` means each takes W seconds.

    With a measured mean request duration the check is real: concurrency / duration should give the same
    throughput the token rate does; without one it shows the per-token time the figures imply.
    """
    implied = point.concurrency / rps_per_replica
    measured_rps = deviation = consistent = None
    if point.mean_e2e_s is not None:
        measured_rps = point.concurrency / point.mean_e2e_s
        deviation = 100 * (measured_rps - rps_per_replica) / rps_per_replica
        consistent = abs(deviation) <= 100 * LITTLE_TOLERANCE
    return Little(
        implied_request_s=implied,
        implied_ms_per_output_token=1000 * implied / output_tokens,
        measured_request_s=point.mean_e2e_s,
        measured_rps=measured_rps,
        deviation_pct=deviation,
        consistent=consistent,
    )


def decode(model: ModelSpec, gpu: GpuSpec, tp: int, traffic: Traffic, point: OperatingPoint) -> Decode:
    """Decode reads every weight each step (split over ``tp`` GPUs) plus each running request's KV cache, at
    HBM bandwidth at best; a measured rate above this ceiling means a figure is wrong."""
    bandwidth = tp * gpu.bandwidth_tbs * 1e12
    single = bandwidth / model.weight_bytes
    mean_context = traffic.input_tokens + traffic.output_tokens / 2
    step_bytes = model.weight_bytes + point.concurrency * mean_context * model.kv_bytes_per_token
    ceiling = point.concurrency * bandwidth / step_bytes
    return Decode(
        single_request_max_tps=single,
        min_tpot_ms=1000 / single,
        batch_ceiling_tps=ceiling,
        per_request_tps=point.output_tps / point.concurrency,
        ceiling_used_pct=100 * point.output_tps / ceiling,
    )


def warnings_for(inputs: PlanInputs, mem: Memory, dec: Decode, lit: Little) -> list[str]:
    """Things that do not stop the estimate but make it doubtful."""
    out = []
    point, model = inputs.point, inputs.model
    if point.concurrency > mem.concurrency:
        out.append(
            f"the operating point's concurrency ({point.concurrency}) is above what memory allows "
            f"({mem.concurrency}): prefix sharing, shorter requests than planned, or wrong figures"
        )
    if point.output_tps > dec.batch_ceiling_tps:
        out.append(
            f"{_num(point.output_tps)} output tok/s is above the HBM ceiling at concurrency {point.concurrency} "
            f"({_num(dec.batch_ceiling_tps)} tok/s): check the figures (or speculative decoding is on)"
        )
    if inputs.tp > model.kv_heads or model.kv_heads % inputs.tp:
        out.append(
            f"{model.kv_heads} KV heads do not split evenly over TP {inputs.tp}: heads are replicated, so the KV "
            "capacity is smaller than estimated"
        )
    if lit.consistent is False:
        out.append(
            f"Little's law: concurrency / measured duration gives {lit.measured_rps:.2f} RPS, "
            f"{lit.deviation_pct:+.0f}% off the {inputs.traffic.output_tokens}-token request shape's figure"
        )
    bench = point.bench
    if bench is not None:
        if bench.interrupted:
            out.append(f"{bench.path} is from an interrupted run: its figures are partial")
        planned = inputs.traffic.output_tokens
        if bench.mean_output_tokens and abs(bench.mean_output_tokens - planned) > SHAPE_TOLERANCE * planned:
            out.append(
                f"the bench's requests averaged {bench.mean_output_tokens:.0f} output tokens, not {planned}: "
                "bench the planned request shape"
            )
    if inputs.gpu.price_per_hour is None:
        out.append(f"no price for {inputs.gpu.name}: pass --gpu-price for the cost")
    return out


def compute_plan(inputs: PlanInputs) -> Plan:
    """Every figure of the estimate, from validated inputs."""
    mem = memory(inputs.model, inputs.gpu, inputs.tp, inputs.mem_fraction, inputs.traffic)
    fl = fleet(inputs.point, inputs.traffic, inputs.gpu, inputs.tp)
    host = hosted(inputs.traffic, inputs.hosted) if inputs.hosted is not None else None
    lit = little(inputs.point, fl.rps_per_replica, inputs.traffic.output_tokens)
    dec = decode(inputs.model, inputs.gpu, inputs.tp, inputs.traffic, inputs.point)
    return Plan(inputs, mem, fl, host, lit, dec, tuple(warnings_for(inputs, mem, dec, lit)))


# Reading a bench report ---------------------------------------------------------------------------------


def _get(mapping: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(mapping, dict):
            return None
        mapping = mapping.get(key)
    return mapping


def _number_at(mapping: Any, *keys: str) -> float | None:
    """A number in the report, or ``None`` where it is missing or not a number (a hand-edited file)."""
    value = _get(mapping, *keys)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _within(value: float | None, limit: float) -> bool:
    """A missing TPOT (one-token replies) meets the bound, as in the bench's own SLO."""
    return value is None or value <= limit


def _closed_loop(level: Any) -> bool:
    concurrency = _get(level, "concurrency")
    return isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1


def point_from_bench(
    path: Path,
    *,
    percentile: str = "p95",
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> OperatingPoint:
    """The closed-loop level of a ``spillgate bench --json`` report with the most output tokens/s among those
    meeting the SLO: ``percentile`` TTFT and TPOT within bounds (the run's own, unless given) and at most 1%
    of requests failed. One replica must have served it, so its concurrency is per replica."""
    try:
        report = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise PlanError(f"--from-bench: cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise PlanError(f"--from-bench: {path} is not JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("version") != 1 or not isinstance(report.get("levels"), list):
        raise PlanError(f"--from-bench: {path} is not a 'spillgate bench --json' report (version 1)")
    ttft_bound = slo_ttft_ms if slo_ttft_ms is not None else _number_at(report, "config", "slo_ttft_ms")
    tpot_bound = slo_tpot_ms if slo_tpot_ms is not None else _number_at(report, "config", "slo_tpot_ms")
    if ttft_bound is None or tpot_bound is None:
        raise PlanError(f"--from-bench: {path} names no SLO; pass --slo-ttft-ms and --slo-tpot-ms")
    closed = [level for level in report["levels"] if _closed_loop(level)]
    if not closed:
        raise PlanError(f"--from-bench: {path} has no closed-loop level; run 'spillgate bench --concurrency ...'")
    qualifying = []
    seen = []
    for level in closed:
        ttft, tpot = _number_at(level, "ttft_ms", percentile), _number_at(level, "tpot_ms", percentile)
        completed = _number_at(level, "requests", "completed") or 0
        failed = _number_at(level, "requests", "failed") or 0
        ok = (
            completed > 0
            and failed <= MAX_BENCH_ERROR_RATE * (completed + failed)
            and ttft is not None
            and _within(ttft, ttft_bound)
            and _within(tpot, tpot_bound)
        )
        seen.append(f"c={level['concurrency']}: TTFT {_ms(ttft)}, TPOT {_ms(tpot)}, {failed:g} failed")
        if ok:
            qualifying.append(level)
    if not qualifying:
        raise PlanError(
            f"--from-bench: no level of {path} meets {percentile} TTFT <= {ttft_bound:g} ms, TPOT <= {tpot_bound:g} "
            f"ms with <= {_pct(MAX_BENCH_ERROR_RATE)} failed ({'; '.join(seen)})"
        )
    best = max(qualifying, key=lambda level: (_number_at(level, "output_throughput_tps") or 0, -level["concurrency"]))
    label = str(best.get("label") or f"c={best['concurrency']}")
    served = _get(best, "backends")
    backends = [str(name) for name in served] if isinstance(served, dict) else []
    if len(backends) > 1:
        raise PlanError(
            f"--from-bench: level {label} of {path} was served by {len(backends)} backends "
            f"({', '.join(backends)}); bench a single replica so its concurrency is per replica"
        )
    output_tps = _number_at(best, "output_throughput_tps")
    if output_tps is None or output_tps <= 0:
        raise PlanError(f"--from-bench: level {label} of {path} has no output_throughput_tps")
    completed = _number_at(best, "requests", "completed")
    mean_e2e = _number_at(best, "e2e_ms", "mean")
    prompt, completion = _number_at(best, "tokens", "prompt"), _number_at(best, "tokens", "completion")
    return OperatingPoint(
        concurrency=best["concurrency"],
        output_tps=output_tps,
        mean_e2e_s=mean_e2e / 1000 if mean_e2e is not None and mean_e2e > 0 else None,
        bench=BenchLevel(
            path=str(path),
            label=label,
            percentile=percentile,
            ttft_ms=_number_at(best, "ttft_ms", percentile),
            tpot_ms=_number_at(best, "tpot_ms", percentile),
            slo_ttft_ms=float(ttft_bound),
            slo_tpot_ms=float(tpot_bound),
            mean_prompt_tokens=prompt / completed if completed and prompt is not None else None,
            mean_output_tokens=completion / completed if completed and completion is not None else None,
            interrupted=bool(report.get("interrupted")),
        ),
    )


# Presenting ---------------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """JSON without float noise (12 significant digits): 1439999.9999999998 requests/day is 1440000.0."""
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return float(f"{value:.12g}") if isinstance(value, float) else value


def to_json(plan: Plan) -> dict[str, Any]:
    """The figures for scripts: the inputs as used, the headline numbers at the top level, then each step."""
    mem, fl = plan.memory, plan.fleet
    return _clean(
        {
            "version": JSON_VERSION,
            "inputs": asdict(plan.inputs),
            "kv_bytes_per_token": mem.kv_bytes_per_token,
            "kv_capacity_bytes": mem.kv_capacity_bytes,
            "kv_capacity_tokens": mem.kv_capacity_tokens,
            "memory_bound_concurrency": mem.concurrency,
            "concurrency": plan.inputs.point.concurrency,
            "output_tps": plan.inputs.point.output_tps,
            "rps_per_replica": fl.rps_per_replica,
            "replicas": fl.replicas,
            "gpus": fl.gpus,
            "gpu_cost_per_day": fl.cost_per_day,
            "hosted_cost_per_day": plan.hosted.cost_per_day if plan.hosted else None,
            "memory": asdict(mem),
            "fleet": asdict(fl),
            "hosted": asdict(plan.hosted) if plan.hosted else None,
            "littles_law": asdict(plan.little),
            "decode_bound": asdict(plan.decode),
            "warnings": list(plan.warnings),
        }
    )


def _num(value: float) -> str:
    """Thousands separators; whole numbers without decimals, others with one."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _sig(value: float) -> str:
    """Three significant digits, no trailing zeros: 3.8, 1.34, 65, 0.05, so the shown division adds up."""
    digits = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _gb(value: float) -> str:
    return f"{value / GB:,.1f} GB"


def _pct(value: float) -> str:
    return f"{100 * value:g}%"


def _ms(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.0f} ms"


def _usd(value: float) -> str:
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def _ratio(value: float) -> str:
    """1/3 rather than 0.333333 where a small fraction says it exactly."""
    fraction = Fraction(value).limit_denominator(12)
    return f"{fraction}" if abs(float(fraction) - value) < 1e-9 and fraction.denominator > 1 else f"{value:g}"


def _bytes(value: float) -> str:
    return f"{value:g} B" if value < 1024 else f"{value / 1024:,.4g} KiB"


def format_table(plan: Plan) -> str:
    """The estimate as a person would write it down: each figure with the arithmetic behind it."""
    inputs, mem, fl, lit, dec = plan.inputs, plan.memory, plan.fleet, plan.little, plan.decode
    model, gpu, traffic, point = inputs.model, inputs.gpu, inputs.traffic, inputs.point
    rows: list[tuple[str, str, str]] = []

    def section(title: str) -> None:
        rows.append((title, "", ""))

    def row(label: str, value: str, why: str = "") -> None:
        rows.append((f"  {label}", value, why))

    section("memory (per replica)")
    row("weights", _gb(mem.weight_bytes), f"{model.params / 1e9:g}B params x {model.weight_dtype}")
    row("usable", _gb(mem.usable_bytes), f"{_pct(inputs.mem_fraction)} of {inputs.tp} x {gpu.memory_gb:g} GB")
    row("KV cache capacity", _gb(mem.kv_capacity_bytes), f"{mem.kv_capacity_tokens:,} tokens")
    row(
        "KV bytes per token",
        _bytes(mem.kv_bytes_per_token),
        f"{mem.kv_bytes_per_token:,.0f} B = 2 x {model.layers} layers x {model.kv_heads} KV heads x "
        f"{model.head_dim} x {model.kv_dtype}",
    )
    row(
        "KV per request",
        f"{mem.kv_bytes_per_request / GB:,.2f} GB",
        f"{traffic.input_tokens:,} in + {traffic.output_tokens:,} out tokens",
    )
    row("memory-bound concurrency", f"{mem.concurrency}", "requests, rounded down")
    source = "flags" if point.bench is None else f"{point.bench.path}, level {point.bench.label}"
    section(f"operating point ({source})")
    if point.bench is not None:
        b = point.bench
        row(
            "meets the SLO",
            f"{b.percentile} TTFT {_ms(b.ttft_ms)}, TPOT {_ms(b.tpot_ms)}",
            f"<= {b.slo_ttft_ms:g} ms, <= {b.slo_tpot_ms:g} ms",
        )
    row("concurrency", f"{point.concurrency}", "requests in flight per replica")
    row("output tokens/s", _num(point.output_tps), "per replica")
    row(
        "RPS per replica",
        f"{_sig(fl.rps_per_replica)}",
        f"{_num(point.output_tps)} / {traffic.output_tokens:,} output tokens",
    )
    section("fleet")
    row(
        "required capacity",
        f"{_sig(fl.required_rps)} RPS",
        f"{_num(traffic.peak_rps)} peak + {_pct(traffic.headroom)} headroom",
    )
    row("replicas", f"{fl.replicas}", f"{_sig(fl.required_rps)} / {_sig(fl.rps_per_replica)}, rounded up")
    row("GPUs", f"{fl.gpus}", f"{fl.replicas} x TP {inputs.tp} {gpu.name}")
    section("cost per day")
    if gpu.price_per_hour is not None and fl.cost_per_day is not None:
        row(
            "GPUs at peak",
            _usd(fl.cost_per_day),
            f"{fl.gpus} x {_usd(gpu.price_per_hour)}/GPU-hour x {HOURS_PER_DAY} h",
        )
    else:
        row("GPUs at peak", "-", "pass --gpu-price")
    if plan.hosted is not None and inputs.hosted is not None:
        row(
            "hosted API",
            _usd(plan.hosted.cost_per_day),
            f"{plan.hosted.requests_per_day:,.0f} requests/day at {_ratio(traffic.avg_to_peak)} of peak; "
            f"{_usd(inputs.hosted.input_per_mtok)}/M in, {_usd(inputs.hosted.output_per_mtok)}/M out",
        )
    section("Little's law (L = lambda x W)")
    row(
        "implied request duration",
        f"{lit.implied_request_s:.1f} s",
        f"{point.concurrency} / {_sig(fl.rps_per_replica)} RPS",
    )
    row(
        "implied time per output token",
        f"{lit.implied_ms_per_output_token:.0f} ms",
        f"{lit.implied_request_s:.1f} s / {traffic.output_tokens:,} tokens",
    )
    if lit.measured_request_s is not None and lit.measured_rps is not None and lit.deviation_pct is not None:
        verdict = "consistent" if lit.consistent else "INCONSISTENT"
        row(
            "measured request duration",
            f"{lit.measured_request_s:.1f} s",
            f"{point.concurrency} / {lit.measured_request_s:.1f} s = {lit.measured_rps:.2f} RPS "
            f"({lit.deviation_pct:+.1f}%): {verdict}",
        )
    section("decode bound (HBM)")
    row("one request alone", f"{dec.single_request_max_tps:,.0f} tok/s", f"TPOT >= {dec.min_tpot_ms:.1f} ms")
    row(
        f"batch of {point.concurrency}",
        f"{dec.batch_ceiling_tps:,.0f} tok/s",
        f"measured {_num(point.output_tps)} = {dec.ceiling_used_pct:.0f}% of it; "
        f"{dec.per_request_tps:.1f} tok/s per request",
    )
    header = (
        f"spillgate plan: {model.name} ({model.weight_dtype} weights, {model.kv_dtype} KV) on {inputs.tp} x "
        f"{gpu.name} per replica, {_num(traffic.peak_rps)} RPS peak"
    )
    width = max(len(label) for label, value, _ in rows if value)
    value_width = max(len(value) for _, value, _ in rows)
    lines = [header, ""]
    for label, value, why in rows:
        if not value:
            lines.extend(["", label] if len(lines) > 2 else [label])
            continue
        lines.append(f"{label.ljust(width)}  {value.rjust(value_width)}  {why}".rstrip())
    lines.extend(f"warning: {warning}" for warning in plan.warnings)
    if plan.warnings:
        lines.insert(len(lines) - len(plan.warnings), "")
    return "\n".join(lines)


# CLI ----------------------------------------------------------------------------------------------------

EXAMPLES = f"""examples:
  spillgate plan --model llama-3.1-70b-fp8 --gpu h100-80gb --tp 2 --input-tokens 3000 --output-tokens 300 \\
      --peak-rps 50 --headroom 30% --avg-to-peak 1/3 --hosted-input-price 3 --hosted-output-price 15 \\
      --concurrency 48 --output-tps 1140
  spillgate plan --model llama-3.1-8b --gpu h100-80gb --input-tokens 2000 --output-tokens 256 --peak-rps 20 \\
      --from-bench bench.json --json
  spillgate plan --params 32B --layers 64 --kv-heads 8 --head-dim 128 --weight-dtype bf16 --kv-dtype fp8 \\
      --gpu h200-141gb --gpu-price 3.8 --tp 2 ...

models: {", ".join(MODELS)}
gpus: {", ".join(GPUS)}
"""


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value!r}")
    return number


def _positive_int(value: str) -> int:
    number = _non_negative_int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value!r}")
    return number


def _number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def _positive(value: str) -> float:
    number = _number(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value!r}")
    return number


def _non_negative(value: str) -> float:
    number = _number(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value!r}")
    return number


def _fraction(value: str) -> float:
    """``0.3``, ``30%`` or ``1/3``: a ratio written the way it was thought of."""
    text = value.strip()
    try:
        if text.endswith("%"):
            return float(Fraction(text[:-1].strip()) / 100)
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.3, 30% or 1/3, got {value!r}") from None


def _count(value: str) -> float:
    """A parameter count: ``70B``, ``8e9``, ``1.5T``."""
    text = value.strip().upper()
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(text[-1:], 1.0)
    number = _positive(text[:-1] if scale != 1.0 else text) * scale
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite count, got {value!r}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    dtypes = list(DTYPE_BYTES)
    model = parser.add_argument_group("model: a preset, and/or every field (fields override the preset)")
    model.add_argument("--model", choices=sorted(MODELS), metavar="NAME", help="a model preset (listed below)")
    model.add_argument("--params", type=_count, metavar="N", help="parameter count, e.g. 70B or 7e10")
    model.add_argument("--layers", type=_positive_int, metavar="N", help="transformer layers")
    model.add_argument("--kv-heads", type=_positive_int, metavar="N", help="key/value heads (GQA groups)")
    model.add_argument("--head-dim", type=_positive_int, metavar="N", help="dimension of one attention head")
    model.add_argument("--weight-dtype", choices=dtypes, metavar="DTYPE", help=f"weight precision: {', '.join(dtypes)}")
    model.add_argument("--kv-dtype", choices=dtypes, metavar="DTYPE", help="KV cache precision, as --weight-dtype")
    gpu = parser.add_argument_group("GPU: a preset, and/or every field")
    gpu.add_argument("--gpu", choices=sorted(GPUS), metavar="NAME", help="a GPU preset (listed below)")
    gpu.add_argument("--gpu-memory-gb", type=_positive, metavar="GB", help="memory per GPU, GB (1e9 bytes)")
    gpu.add_argument("--gpu-bandwidth-tbs", type=_positive, metavar="TBS", help="HBM bandwidth per GPU, TB/s")
    gpu.add_argument("--gpu-price", type=_non_negative, metavar="USD", help="rental price per GPU-hour")
    replica = parser.add_argument_group("replica")
    replica.add_argument("--tp", type=_positive_int, default=1, metavar="N", help="tensor parallel size (default 1)")
    replica.add_argument(
        "--mem-fraction", type=_fraction, default=0.9, metavar="F", help="usable share of GPU memory (default 0.9)"
    )
    load = parser.add_argument_group("traffic (ratios as 0.3, 30% or 1/3)")
    load.add_argument("--input-tokens", type=_non_negative_int, required=True, metavar="N", help="per request, mean")
    load.add_argument("--output-tokens", type=_positive_int, required=True, metavar="N", help="per request, mean")
    load.add_argument("--peak-rps", type=_positive, required=True, metavar="RPS", help="peak requests/s to serve")
    load.add_argument(
        "--headroom", type=_fraction, default=0.3, metavar="F", help="spare capacity over the peak (default 30%%)"
    )
    load.add_argument(
        "--avg-to-peak",
        type=_fraction,
        default=1.0,
        metavar="F",
        help="the day's mean traffic as a share of the peak, for the hosted cost (default 1)",
    )
    load.add_argument("--hosted-input-price", type=_non_negative, metavar="USD", help="per million input tokens")
    load.add_argument("--hosted-output-price", type=_non_negative, metavar="USD", help="per million output tokens")
    point = parser.add_argument_group("operating point: measured at the SLO, or --from-bench")
    point.add_argument("--concurrency", type=_positive_int, metavar="N", help="requests in flight per replica")
    point.add_argument("--output-tps", type=_positive, metavar="TPS", help="output tokens/s per replica at that load")
    point.add_argument(
        "--mean-e2e-s", type=_positive, metavar="S", help="mean request duration there, for Little's law"
    )
    point.add_argument(
        "--from-bench", type=Path, metavar="FILE", help="a 'spillgate bench --concurrency ... --json' report"
    )
    point.add_argument("--slo-ttft-ms", type=_positive, metavar="MS", help="with --from-bench: TTFT bound (the run's)")
    point.add_argument("--slo-tpot-ms", type=_positive, metavar="MS", help="with --from-bench: TPOT bound (the run's)")
    point.add_argument(
        "--slo-percentile", choices=SLO_PERCENTILES, default="p95", help="with --from-bench: held to the SLO (p95)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.set_defaults(handler=run)
    _one_line_errors(parser)


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """The usage of this many flags fills a screen and buries the mistake: print only the error (``-h`` has the
    usage), on one line, exit 2 as argparse does."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"spillgate plan: {message}\n")

    parser.error = error  # type: ignore[method-assign]


def _model_from_args(args: argparse.Namespace) -> ModelSpec:
    flags = {
        "params": "--params",
        "layers": "--layers",
        "kv_heads": "--kv-heads",
        "head_dim": "--head-dim",
        "weight_dtype": "--weight-dtype",
        "kv_dtype": "--kv-dtype",
    }
    given = {field: getattr(args, field) for field in flags if getattr(args, field) is not None}
    if args.model is not None:
        return replace(MODELS[args.model], **given)
    missing = [flag for field, flag in flags.items() if field not in given]
    if missing:
        raise PlanError(f"pass --model NAME or every model field (missing {', '.join(missing)})")
    return ModelSpec(name="custom", **given)


def _gpu_from_args(args: argparse.Namespace) -> GpuSpec:
    given = {
        field: value
        for field, value in (
            ("memory_gb", args.gpu_memory_gb),
            ("bandwidth_tbs", args.gpu_bandwidth_tbs),
            ("price_per_hour", args.gpu_price),
        )
        if value is not None
    }
    if args.gpu is not None:
        return replace(GPUS[args.gpu], **given)
    required = {"memory_gb": "--gpu-memory-gb", "bandwidth_tbs": "--gpu-bandwidth-tbs"}
    missing = [flag for field, flag in required.items() if field not in given]
    if missing:
        raise PlanError(f"pass --gpu NAME or every GPU field (missing {', '.join(missing)})")
    return GpuSpec(name="custom", price_per_hour=given.pop("price_per_hour", None), **given)


def _point_from_args(args: argparse.Namespace) -> OperatingPoint:
    measured = {"--concurrency": args.concurrency, "--output-tps": args.output_tps, "--mean-e2e-s": args.mean_e2e_s}
    if args.from_bench is not None:
        clash = [flag for flag, value in measured.items() if value is not None]
        if clash:
            raise PlanError(f"--from-bench takes the operating point from the report; drop {', '.join(clash)}")
        return point_from_bench(
            args.from_bench,
            percentile=args.slo_percentile,
            slo_ttft_ms=args.slo_ttft_ms,
            slo_tpot_ms=args.slo_tpot_ms,
        )
    if args.slo_ttft_ms is not None or args.slo_tpot_ms is not None:
        raise PlanError("--slo-ttft-ms and --slo-tpot-ms pick a level of --from-bench; pass that too")
    if args.concurrency is None or args.output_tps is None:
        raise PlanError(
            "pass the operating point: --concurrency N --output-tps T (measured at the SLO), or --from-bench"
        )
    return OperatingPoint(args.concurrency, args.output_tps, mean_e2e_s=args.mean_e2e_s)


def _check_ratios(args: argparse.Namespace) -> None:
    if not 0 < args.mem_fraction <= 1:
        raise PlanError(f"--mem-fraction must be in (0, 1], got {args.mem_fraction:g}")
    if args.headroom < 0:
        raise PlanError(f"--headroom must not be negative, got {args.headroom:g}")
    if not 0 < args.avg_to_peak <= 1:
        raise PlanError(f"--avg-to-peak must be in (0, 1], got {args.avg_to_peak:g}")
    if (args.hosted_input_price is None) != (args.hosted_output_price is None):
        raise PlanError("pass both --hosted-input-price and --hosted-output-price, or neither")


def inputs_from_args(args: argparse.Namespace) -> PlanInputs:
    """Presets overridden by whatever flags were given; ``PlanError`` names the first flag that cannot work."""
    _check_ratios(args)
    prices = None
    if args.hosted_input_price is not None:
        prices = HostedPrices(args.hosted_input_price, args.hosted_output_price)
    return PlanInputs(
        model=_model_from_args(args),
        gpu=_gpu_from_args(args),
        tp=args.tp,
        mem_fraction=args.mem_fraction,
        traffic=Traffic(args.input_tokens, args.output_tokens, args.peak_rps, args.headroom, args.avg_to_peak),
        point=_point_from_args(args),
        hosted=prices,
    )


def run(args: argparse.Namespace) -> int:
    try:
        plan = compute_plan(inputs_from_args(args))
    except PlanError as exc:
        print(f"spillgate plan: {exc}", file=sys.stderr)
        return 2
    except (OverflowError, ZeroDivisionError):
        print("spillgate plan: the inputs are out of range (the arithmetic overflows)", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(orjson.dumps(to_json(plan), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_table(plan))
    return 0
