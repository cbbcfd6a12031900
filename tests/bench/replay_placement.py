"""Replay chat runs' own placement of conversations through the turns-kept-home reference.

    .venv/bin/python -m tests.bench.replay_placement DIR

``DIR`` is a ``tests.bench.compare_routers --trace-dir``: one ``*-chat*-client.jsonl`` per spillgate run
(sglang-router does not say which replica served a request, so its runs are skipped). For each run it prints
the client's TTFT p99, the same requests in the reference's timing model (:mod:`tests.bench.ideal_placement`:
one prefill per pass, no decode) with each conversation on the replica the run put it on, and with each
conversation on the replica that model frees first. If the first two rank runs alike, the model sees what
set the runs' tails. The third is not a fair comparison: a chat run's arrival times depend on its own
placement (a session is ready again only once its turn is answered, so sessions answered together on one
replica return together), and any other placement of the same arrivals spreads the bursts the run had.

Each request keeps the cached tokens the run's replicas reported, so compare runs at their best achievable
hit rate (spillgate's chat runs are).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from spillgate.backends.sim.presets import get_preset
from spillgate.gateway.bench.stats import percentile
from tests.bench.compare_cluster import PRESET
from tests.bench.compare_routers import spillgate_traces
from tests.bench.ideal_placement import IdealRequest, replayed_ttfts, sticky_ttfts


def replay_run(rows: Sequence[dict], replicas: Sequence[str]) -> tuple[list[float], list[float], list[float]]:
    """TTFTs in seconds of one run's served requests: as measured, replayed with the run's own placement,
    placed by the reference. ``replicas`` names the run's replicas (those it may have placed requests on)."""
    served = [row for row in rows if row["ok"] and row["ttft"] is not None]
    requests = [
        IdealRequest(row["start"], row["prompt_tokens"], row["cached_tokens"], session=row.get("session"))
        for row in served
    ]
    chosen = [replicas.index(row["backend"]) for row in served]
    preset = get_preset(PRESET)
    own = replayed_ttfts(requests, len(replicas), preset, chosen)
    greedy = sticky_ttfts(requests, len(replicas), preset)
    return [row["ttft"] for row in served], own, greedy


def _p99_ms(values: Sequence[float]) -> str:
    p99 = percentile(values, 99)
    return "-" if p99 is None else f"{1000.0 * p99:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--replicas", type=int, default=4, help="replicas the runs had (compare_routers' default 4)")
    args = parser.parse_args()
    paths = spillgate_traces(args.trace_dir, "chat*", "client")
    print("run | measured p99 ms | replayed, own placement | replayed, reference placement")
    pooled: tuple[list[float], list[float], list[float]] = ([], [], [])
    for path in paths:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        if any("session" not in row for row in rows):
            raise SystemExit(f"{path}: rows name no session (a trace from before client rows named their chat session)")
        replicas = sorted({row["backend"] for row in rows if row["ok"]})
        if len(replicas) > args.replicas:
            raise SystemExit(f"{path}: {len(replicas)} replicas served requests; pass --replicas")
        # A replica that served nothing in the run still queued nothing: name it so the model has it.
        replicas += [f"(idle {i})" for i in range(args.replicas - len(replicas))]
        figures = replay_run(rows, replicas)
        for pool, values in zip(pooled, figures, strict=True):
            pool.extend(values)
        print(f"{path.stem} | " + " | ".join(_p99_ms(values) for values in figures))
    print(f"pooled ({len(paths)} runs) | " + " | ".join(_p99_ms(values) for values in pooled))


if __name__ == "__main__":
    main()
