"""The arithmetic of a plan: pure functions of validated inputs, so they can be checked against a hand estimate."""

from __future__ import annotations

import math

from spillgate.gateway.plan.formatting import gb, num, pct
from spillgate.gateway.plan.inputs import (
    GB,
    GpuSpec,
    HostedPrices,
    ModelSpec,
    OperatingPoint,
    PlanError,
    PlanInputs,
    Traffic,
)
from spillgate.gateway.plan.results import Decode, Fleet, Hosted, Little, Memory, Plan

SECONDS_PER_DAY = 86_400
HOURS_PER_DAY = 24
LITTLE_TOLERANCE = 0.10
"""Little's law holds when the measured mean request duration predicts the throughput within this much."""
SHAPE_TOLERANCE = 0.10
"""Warn when the bench's mean output tokens differ from the planned request shape by more than this."""


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
            f"the weights ({gb(model.weight_bytes)}) do not fit in {gb(usable)} usable "
            f"({pct(mem_fraction)} of {tp} x {gpu.memory_gb:g} GB): raise --tp or use smaller weights"
        )
    per_token = model.kv_bytes_per_token
    per_request = traffic.tokens_per_request * per_token
    concurrency = floor_count(capacity / per_request)
    if concurrency < 1:
        raise PlanError(
            f"one request's KV cache ({gb(per_request)}) does not fit in the {gb(capacity)} the weights leave: "
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
            f"{num(point.output_tps)} output tok/s is above the HBM ceiling at concurrency {point.concurrency} "
            f"({num(dec.batch_ceiling_tps)} tok/s): check the figures (or speculative decoding is on)"
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
