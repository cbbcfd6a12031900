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

from spillgate.gateway.bench.stats import percentile
from tests.bench.compare_routers import spillgate_traces


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
    slowest = sorted(pairs)[len(pairs) * 3 // 4 :]
    error_ms = statistics.fmean(real - predicted for predicted, real in pairs) * 1000 / time_scale
    return (
        f"{len(pairs)} requests | real/predicted {_deciles(pairs)} | "
        f"slowest-predicted quarter: {_deciles(slowest)} | mean error {error_ms:+.0f} ms"
    )


def _deciles(pairs: Sequence[tuple[float, float]]) -> str:
    """p10, p50 and p90 of real / predicted."""
    ratios = [real / predicted for predicted, real in pairs if predicted > 0]
    if not ratios:
        return "-"
    return ", ".join(f"p{pct} {percentile(ratios, pct) or 0.0:.2f}" for pct in (10, 50, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--time-scale", type=float, default=6.0, help="the runs' --time-scale (default 6)")
    args = parser.parse_args()
    pooled: list[tuple[float, float]] = []
    for path in spillgate_traces(args.trace_dir, "*", "gateway"):
        pairs = predicted_and_real([orjson.loads(line) for line in path.read_bytes().splitlines()])
        pooled.extend(pairs)
        print(f"{path.name.removesuffix('-gateway.jsonl')}: {summary(pairs, args.time_scale)}")
    print(f"pooled: {summary(pooled, args.time_scale)}")


if __name__ == "__main__":
    main()
