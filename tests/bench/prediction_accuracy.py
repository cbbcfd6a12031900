"""How well the gateway's predicted TTFT matched what happened, from ``compare_routers --trace-dir`` runs.

    .venv/bin/python -m tests.bench.prediction_accuracy DIR [--time-scale 6]

For every streamed request in each ``spillgate-*-gateway.jsonl`` of ``DIR``: the predicted TTFT of the replica
the policy chose (:func:`policies.prediction.predicted_ttft`, as the trace recorded it) against its real TTFT
from the same instant (the decision) to its first token. Prints, per run, the median and 10th/90th percentiles
of real / predicted over all requests and over the quarter predicted slowest (where a replica had a queue: the
predictions that decide moves, spills and SLO refusals), and the mean error in simulated ms.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

import orjson

from gateway.bench.stats import percentile


def predicted_and_real(entries: Sequence[dict]) -> list[tuple[float, float]]:
    """(predicted, real) TTFT in seconds of every request of one run that reached its first token."""
    pairs = []
    for entry in entries:
        if not entry.get("first_token_at"):
            continue
        chosen = next((b for b in entry["backends"] if b["name"] == entry["chosen"]), None)
        if chosen is None or entry["backend"] != entry["chosen"]:
            continue  # served elsewhere after a failure, or by a hosted backend
        pairs.append((chosen["predicted_ttft_s"], entry["first_token_at"] - entry["decided_at"]))
    return pairs


def summary(pairs: Sequence[tuple[float, float]], time_scale: float) -> str:
    ratios = [real / predicted for predicted, real in pairs if predicted > 0]
    slowest = sorted(pairs)[len(pairs) * 3 // 4 :]
    slow_ratios = [real / predicted for predicted, real in slowest if predicted > 0]
    error_ms = statistics.fmean(real - predicted for predicted, real in pairs) * 1000 / time_scale
    return (
        f"{len(pairs)} requests | real/predicted p10 {_q(ratios, 10)}, p50 {_q(ratios, 50)}, p90 {_q(ratios, 90)} | "
        f"slowest-predicted quarter: p10 {_q(slow_ratios, 10)}, p50 {_q(slow_ratios, 50)}, "
        f"p90 {_q(slow_ratios, 90)} | mean error {error_ms:+.0f} ms"
    )


def _q(values: Sequence[float], pct: float) -> str:
    value = percentile(list(values), pct)
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--time-scale", type=float, default=6.0, help="the runs' --time-scale (default 6)")
    args = parser.parse_args()
    paths = sorted(args.trace_dir.glob("spillgate-*-gateway.jsonl"))
    if not paths:
        raise SystemExit(f"no spillgate gateway traces in {args.trace_dir} (compare_routers --trace-dir)")
    pooled: list[tuple[float, float]] = []
    for path in paths:
        pairs = predicted_and_real([orjson.loads(line) for line in path.read_bytes().splitlines()])
        pooled.extend(pairs)
        print(f"{path.name.removesuffix('-gateway.jsonl')}: {summary(pairs, args.time_scale)}")
    print(f"pooled: {summary(pooled, args.time_scale)}")


if __name__ == "__main__":
    main()
