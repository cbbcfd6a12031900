"""``spillgate plan``: the GPU capacity estimate an engineer would otherwise do by hand.

From a model, a GPU, a request shape, peak traffic and one measured operating point (the concurrency and
output tokens/s a replica sustains within the latency SLO, given or read from a ``spillgate bench`` JSON),
it derives the KV cache per token and per replica, the memory-bound concurrency, requests/s per replica,
replicas and GPUs for the peak with headroom, their cost per day, what a hosted API would charge for the same
traffic, and a Little's-law check of the operating point. With ``--from URL`` it plans each pool of a running
gateway from what the gateway measured instead (:mod:`gateway.plan.live`).

Sizes are decimal (1 GB = 1e9 bytes) and parameter counts nominal (70B = 70e9), as on spec sheets and in a
back-of-the-envelope estimate, so the figures match the ones written by hand.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import orjson

from spillgate.gateway.plan.arg_types import (
    fraction,
    non_negative,
    non_negative_int,
    param_count,
    positive,
    positive_int,
)
from spillgate.gateway.plan.bench_report import SLO_PERCENTILES, point_from_bench
from spillgate.gateway.plan.estimate import compute_plan
from spillgate.gateway.plan.inputs import (
    DTYPE_BYTES,
    GPUS,
    MODELS,
    GpuSpec,
    HostedPrices,
    ModelSpec,
    OperatingPoint,
    PlanError,
    PlanInputs,
    Traffic,
)
from spillgate.gateway.plan.live import TOKEN_ENV, gateway_url, run_live
from spillgate.gateway.plan.render import format_table, to_json

EXAMPLES = f"""examples:
  spillgate plan --model llama-3.1-70b-fp8 --gpu h100-80gb --tp 2 --input-tokens 3000 --output-tokens 300 \\
      --peak-rps 50 --headroom 30% --avg-to-peak 1/3 --hosted-input-price 3 --hosted-output-price 15 \\
      --concurrency 48 --output-tps 1140
  spillgate plan --model llama-3.1-8b --gpu h100-80gb --input-tokens 2000 --output-tokens 256 --peak-rps 20 \\
      --from-bench bench.json --json
  spillgate plan --params 32B --layers 64 --kv-heads 8 --head-dim 128 --weight-dtype bf16 --kv-dtype fp8 \\
      --gpu h200-141gb --gpu-price 3.8 --tp 2 ...
  spillgate plan --from http://127.0.0.1:8080 --token "$SPILLGATE_METRICS_TOKEN"

models: {", ".join(MODELS)}
gpus: {", ".join(GPUS)}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    dtypes = list(DTYPE_BYTES)
    model = parser.add_argument_group("model: a preset, and/or every field (fields override the preset)")
    model.add_argument("--model", choices=sorted(MODELS), metavar="NAME", help="a model preset (listed below)")
    model.add_argument("--params", type=param_count, metavar="N", help="parameter count, e.g. 70B or 7e10")
    model.add_argument("--layers", type=positive_int, metavar="N", help="transformer layers")
    model.add_argument("--kv-heads", type=positive_int, metavar="N", help="key/value heads (GQA groups)")
    model.add_argument("--head-dim", type=positive_int, metavar="N", help="dimension of one attention head")
    model.add_argument("--weight-dtype", choices=dtypes, metavar="DTYPE", help=f"weight precision: {', '.join(dtypes)}")
    model.add_argument("--kv-dtype", choices=dtypes, metavar="DTYPE", help="KV cache precision, as --weight-dtype")
    gpu = parser.add_argument_group("GPU: a preset, and/or every field")
    gpu.add_argument("--gpu", choices=sorted(GPUS), metavar="NAME", help="a GPU preset (listed below)")
    gpu.add_argument("--gpu-memory-gb", type=positive, metavar="GB", help="memory per GPU, GB (1e9 bytes)")
    gpu.add_argument("--gpu-bandwidth-tbs", type=positive, metavar="TBS", help="HBM bandwidth per GPU, TB/s")
    gpu.add_argument("--gpu-price", type=non_negative, metavar="USD", help="rental price per GPU-hour")
    replica = parser.add_argument_group("replica")
    replica.add_argument("--tp", type=positive_int, default=1, metavar="N", help="tensor parallel size (default 1)")
    replica.add_argument(
        "--mem-fraction", type=fraction, default=0.9, metavar="F", help="usable share of GPU memory (default 0.9)"
    )
    load = parser.add_argument_group("traffic (ratios as 0.3, 30% or 1/3)")
    load.add_argument("--input-tokens", type=non_negative_int, metavar="N", help="per request, mean (required)")
    load.add_argument("--output-tokens", type=positive_int, metavar="N", help="per request, mean (required)")
    load.add_argument("--peak-rps", type=positive, metavar="RPS", help="peak requests/s to serve (required)")
    load.add_argument(
        "--headroom", type=fraction, default=0.3, metavar="F", help="spare capacity over the peak (default 30%%)"
    )
    load.add_argument(
        "--avg-to-peak",
        type=fraction,
        default=1.0,
        metavar="F",
        help="the day's mean traffic as a share of the peak, for the hosted cost (default 1)",
    )
    load.add_argument("--hosted-input-price", type=non_negative, metavar="USD", help="per million input tokens")
    load.add_argument("--hosted-output-price", type=non_negative, metavar="USD", help="per million output tokens")
    point = parser.add_argument_group("operating point: measured at the SLO, or --from-bench")
    point.add_argument("--concurrency", type=positive_int, metavar="N", help="requests in flight per replica")
    point.add_argument("--output-tps", type=positive, metavar="TPS", help="output tokens/s per replica at that load")
    point.add_argument("--mean-e2e-s", type=positive, metavar="S", help="mean request duration there, for Little's law")
    point.add_argument(
        "--from-bench", type=Path, metavar="FILE", help="a 'spillgate bench --concurrency ... --json' report"
    )
    point.add_argument("--slo-ttft-ms", type=positive, metavar="MS", help="with --from-bench: TTFT bound (the run's)")
    point.add_argument("--slo-tpot-ms", type=positive, metavar="MS", help="with --from-bench: TPOT bound (the run's)")
    point.add_argument(
        "--slo-percentile", choices=SLO_PERCENTILES, default="p95", help="with --from-bench: held to the SLO (p95)"
    )
    live = parser.add_argument_group("or plan every pool of a running gateway from its measurements")
    live.add_argument(
        "--from",
        dest="from_url",
        type=gateway_url,
        metavar="URL",
        help="the gateway's base URL: its GET /capacity gives the traffic, throughput and prices (no other flags)",
    )
    live.add_argument(
        "--token", metavar="TOKEN", help=f"with --from: the gateway's metrics.token (default: ${TOKEN_ENV})"
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


_PLAN_FLAGS = {
    "model": "--model", "params": "--params", "layers": "--layers", "kv_heads": "--kv-heads",
    "head_dim": "--head-dim", "weight_dtype": "--weight-dtype", "kv_dtype": "--kv-dtype", "gpu": "--gpu",
    "gpu_memory_gb": "--gpu-memory-gb", "gpu_bandwidth_tbs": "--gpu-bandwidth-tbs", "gpu_price": "--gpu-price",
    "input_tokens": "--input-tokens", "output_tokens": "--output-tokens", "peak_rps": "--peak-rps",
    "hosted_input_price": "--hosted-input-price", "hosted_output_price": "--hosted-output-price",
    "concurrency": "--concurrency", "output_tps": "--output-tps", "mean_e2e_s": "--mean-e2e-s",
    "from_bench": "--from-bench", "slo_ttft_ms": "--slo-ttft-ms", "slo_tpot_ms": "--slo-tpot-ms",
}  # fmt: skip
"""The flags that plan from given figures, by their ``args`` names: none of them goes with ``--from``."""


def _check_source(args: argparse.Namespace) -> None:
    """Either the figures as flags or ``--from`` a gateway, never both; and the traffic is required without it."""
    given = [flag for name, flag in _PLAN_FLAGS.items() if getattr(args, name) is not None]
    if args.from_url is not None:
        if given:
            raise PlanError(f"--from takes every figure from the gateway; drop {', '.join(given)}")
        return
    if args.token is not None:
        raise PlanError("--token is the gateway's metrics token, for --from URL")
    missing = [flag for flag in ("--input-tokens", "--output-tokens", "--peak-rps") if flag not in given]
    if missing:
        raise PlanError(f"the following arguments are required: {', '.join(missing)} (or --from URL)")


def inputs_from_args(args: argparse.Namespace) -> PlanInputs:
    """Presets overridden by whatever flags were given; ``PlanError`` names the first flag that cannot work."""
    _check_source(args)
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
    if args.from_url is not None:
        try:
            _check_source(args)
        except PlanError as exc:
            print(f"spillgate plan: {exc}", file=sys.stderr)
            return 2
        return run_live(args)
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
