"""A plan as output: JSON for scripts, or a table that shows the arithmetic behind each figure."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from spillgate.gateway.plan.estimate import HOURS_PER_DAY
from spillgate.gateway.plan.formatting import byte_size, gb, ms, num, pct, ratio, sig, usd
from spillgate.gateway.plan.inputs import GB
from spillgate.gateway.plan.results import Plan

JSON_VERSION = 1


def clean_floats(value: Any) -> Any:
    """JSON without float noise (12 significant digits): 1439999.9999999998 requests/day is 1440000.0; a figure
    that is not a number (a replica's NaN gauge) is null."""
    if isinstance(value, dict):
        return {key: clean_floats(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean_floats(item) for item in value]
    if isinstance(value, float):
        return float(f"{value:.12g}") if math.isfinite(value) else None
    return value


def to_json(plan: Plan) -> dict[str, Any]:
    """The figures for scripts: the inputs as used, the headline numbers at the top level, then each step."""
    mem, fl = plan.memory, plan.fleet
    return clean_floats(
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
    row("weights", gb(mem.weight_bytes), f"{model.params / 1e9:g}B params x {model.weight_dtype}")
    row("usable", gb(mem.usable_bytes), f"{pct(inputs.mem_fraction)} of {inputs.tp} x {gpu.memory_gb:g} GB")
    row("KV cache capacity", gb(mem.kv_capacity_bytes), f"{mem.kv_capacity_tokens:,} tokens")
    row(
        "KV bytes per token",
        byte_size(mem.kv_bytes_per_token),
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
            f"{b.percentile} TTFT {ms(b.ttft_ms)}, TPOT {ms(b.tpot_ms)}",
            f"<= {b.slo_ttft_ms:g} ms, <= {b.slo_tpot_ms:g} ms",
        )
    row("concurrency", f"{point.concurrency}", "requests in flight per replica")
    row("output tokens/s", num(point.output_tps), "per replica")
    row(
        "RPS per replica",
        f"{sig(fl.rps_per_replica)}",
        f"{num(point.output_tps)} / {traffic.output_tokens:,} output tokens",
    )
    section("fleet")
    row(
        "required capacity",
        f"{sig(fl.required_rps)} RPS",
        f"{num(traffic.peak_rps)} peak + {pct(traffic.headroom)} headroom",
    )
    row("replicas", f"{fl.replicas}", f"{sig(fl.required_rps)} / {sig(fl.rps_per_replica)}, rounded up")
    row("GPUs", f"{fl.gpus}", f"{fl.replicas} x TP {inputs.tp} {gpu.name}")
    section("cost per day")
    if gpu.price_per_hour is not None and fl.cost_per_day is not None:
        row(
            "GPUs at peak",
            usd(fl.cost_per_day),
            f"{fl.gpus} x {usd(gpu.price_per_hour)}/GPU-hour x {HOURS_PER_DAY} h",
        )
    else:
        row("GPUs at peak", "-", "pass --gpu-price")
    if plan.hosted is not None and inputs.hosted is not None:
        row(
            "hosted API",
            usd(plan.hosted.cost_per_day),
            f"{plan.hosted.requests_per_day:,.0f} requests/day at {ratio(traffic.avg_to_peak)} of peak; "
            f"{usd(inputs.hosted.input_per_mtok)}/M in, {usd(inputs.hosted.output_per_mtok)}/M out",
        )
    section("Little's law (L = lambda x W)")
    row(
        "implied request duration",
        f"{lit.implied_request_s:.1f} s",
        f"{point.concurrency} / {sig(fl.rps_per_replica)} RPS",
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
        f"measured {num(point.output_tps)} = {dec.ceiling_used_pct:.0f}% of it; "
        f"{dec.per_request_tps:.1f} tok/s per request",
    )
    header = (
        f"spillgate plan: {model.name} ({model.weight_dtype} weights, {model.kv_dtype} KV) on {inputs.tp} x "
        f"{gpu.name} per replica, {num(traffic.peak_rps)} RPS peak"
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
