"""Reading a measured operating point from a ``spillgate bench --json`` report instead of typing it in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from spillgate.gateway.plan.formatting import ms, pct
from spillgate.gateway.plan.inputs import BenchLevel, OperatingPoint, PlanError

SLO_PERCENTILES = ("p50", "p95", "p99")
MAX_BENCH_ERROR_RATE = 0.01
"""A bench level with more failed requests than this does not count as meeting the SLO."""


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
        seen.append(f"c={level['concurrency']}: TTFT {ms(ttft)}, TPOT {ms(tpot)}, {failed:g} failed")
        if ok:
            qualifying.append(level)
    if not qualifying:
        raise PlanError(
            f"--from-bench: no level of {path} meets {percentile} TTFT <= {ttft_bound:g} ms, TPOT <= {tpot_bound:g} "
            f"ms with <= {pct(MAX_BENCH_ERROR_RATE)} failed ({'; '.join(seen)})"
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
