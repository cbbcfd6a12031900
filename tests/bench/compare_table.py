"""Figures for one (router, workload) run, in simulated time, and the markdown table they make.

Latencies come from the client (every token as it arrived, divided by the time scale). Cache hits and
per-replica shares come from the replicas' own counters, so they are the same figures for a router that
passes no backend header (sglang-router) as for spillgate; the client's usage-based hit rate is kept to check
them against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spillgate.backends.sim import timing
from spillgate.backends.sim.presets import get_preset
from spillgate.gateway.bench.api import LevelResult
from spillgate.gateway.bench.client import RequestResult
from spillgate.gateway.bench.stats import Slo, summarize
from tests.bench.compare_cluster import PRESET, ReplicaCounters

OTHER_CPU_WARN = 0.25
STRETCH_WARN = 1.05
"""Client-measured E2E over the replicas' simulated E2E above this: the replicas (or the machine) lagged."""


@dataclass
class RunFigures:
    """One cell group of the table; times in simulated milliseconds, rates per simulated second."""

    completed: int
    failed: int
    unfinished: int
    hit_rate: float | None
    client_hit_rate: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    goodput_rps: float
    """Requests meeting both SLOs per simulated second of arrivals: the same window for every row, so a slow
    last answer does not dilute it (``spillgate bench`` divides by first send to last answer instead)."""
    slo_pct: float | None
    throughput_rps: float
    offered_rps: float
    shares_pct: list[float]
    spread: float | None
    prefill_busy_pct: list[float]
    window_prefill_busy_pct: float | None
    """The cluster's estimated prefill busy % over the measured requests' arrival window (after any warm-up)."""
    warmup_requests: int
    e2e_stretch: float | None
    ttft_overhead_ms: float | None
    sim_duration_s: float
    wall_s: float
    errors: dict[str, int]
    runs: int = 1
    """Repeats pooled into these figures (``--repeat``), each with its own seed."""
    best_hit_rate: float | None = None
    """The best achievable hit rate of this run's own requests, when they depended on its timing (chat)."""
    ideal_ttft_p99_ms: float | None = None
    """TTFT p99 of the ideal placement of this run's own requests (:mod:`tests.bench.ideal_placement`)."""
    sticky_ttft_p99_ms: float | None = None
    """The same with each conversation's turns kept on the replica of its first (chat only)."""
    cpu_own_cores: float = 0.0
    """Cores the replicas, the router and the load generator used, on average over the run."""
    cpu_other_cores: float = 0.0
    """Cores anything else on the machine used meanwhile: above ``OTHER_CPU_WARN`` the run's timings are suspect."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _scaled(value: float | None, time_scale: float) -> float | None:
    return None if value is None else value / time_scale


def figures(
    levels: Sequence[LevelResult], deltas: Sequence[ReplicaCounters], *, slo: Slo, time_scale: float, wall_s: float
) -> RunFigures:
    """Turn bench levels (wall clock) and the replicas' counter deltas (simulated) into one row's figures.

    Several levels are repeats of the same row (``--repeat``), pooled: percentiles over all their requests,
    rates over the sum of their arrival windows, ``deltas`` summed over the runs. ``slo`` is in wall-clock
    milliseconds, as the levels were measured.
    """
    measured = [r for level in levels for r in level.measured]
    everything = [r for level in levels for r in level.results]
    s = summarize(
        measured,
        duration_s=sum(level.summary.duration_s for level in levels),
        unfinished=sum(level.summary.unfinished for level in levels),
        slo=slo,
    )
    ok = [r for r in measured if r.ok]
    requests = sum(d.requests for d in deltas)
    prompt = sum(d.prompt_tokens for d in deltas)
    cached = sum(d.cached_tokens for d in deltas)
    shares = [100.0 * d.requests / requests if requests else 0.0 for d in deltas]
    low, high = min(shares, default=0.0), max(shares, default=0.0)
    sim_duration = sum(level.summary.duration_s + level.warmup_s for level in levels) / time_scale
    spans = [_span(level.measured) / time_scale for level in levels]
    span = sum(spans)
    sim_e2e_count = sum(d.e2e_count for d in deltas)
    sim_e2e_mean = sum(d.e2e_sum_s for d in deltas) / sim_e2e_count if sim_e2e_count else 0.0
    sim_ttft = sum(d.ttft_sum_s for d in deltas)
    sim_ttft_count = sum(d.ttft_count for d in deltas)
    # The lag checks compare every request, warm-up included, with the replicas' counters over the same runs.
    every_ok = [r for r in everything if r.ok]
    client_e2e_mean = sum(r.e2e for r in every_ok) / len(every_ok) / time_scale if every_ok else 0.0
    client_ttft = [r.ttft / time_scale for r in every_ok if r.ttft is not None]
    met = sum(1 for r in measured if slo.met(r))
    overhead = None
    if client_ttft and sim_ttft_count:
        overhead = 1000.0 * (sum(client_ttft) / len(client_ttft) - sim_ttft / sim_ttft_count)
    window = ReplicaCounters(
        requests=len(ok),
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        cached_tokens=sum(r.cached_tokens for r in ok),
    )
    window_busy = 100.0 * prefill_seconds(window) / (span * len(deltas)) if span > 0 and deltas else None
    return RunFigures(
        completed=s.completed,
        failed=s.failed,
        unfinished=s.unfinished,
        hit_rate=cached / prompt if prompt else None,
        client_hit_rate=s.cache_hit_rate,
        ttft_p50_ms=_scaled(s.ttft_ms.p50, time_scale),
        ttft_p99_ms=_scaled(s.ttft_ms.p99, time_scale),
        tpot_p50_ms=_scaled(s.tpot_ms.p50, time_scale),
        tpot_p99_ms=_scaled(s.tpot_ms.p99, time_scale),
        goodput_rps=met / span if span > 0 else 0.0,
        slo_pct=s.slo_attainment_pct,
        throughput_rps=s.request_throughput * time_scale,
        offered_rps=sum(max(0, len(level.measured) - 1) for level in levels) / span if span > 0 else 0.0,
        shares_pct=shares,
        spread=high / low if low > 0 else None,
        prefill_busy_pct=[100.0 * prefill_seconds(d) / sim_duration if sim_duration else 0.0 for d in deltas],
        window_prefill_busy_pct=window_busy,
        warmup_requests=sum(level.warmup_requests for level in levels),
        e2e_stretch=client_e2e_mean / sim_e2e_mean if sim_e2e_mean else None,
        ttft_overhead_ms=overhead,
        sim_duration_s=sim_duration,
        wall_s=wall_s,
        errors=dict(s.errors),
        runs=len(levels),
    )


def _span(results: Sequence[RequestResult]) -> float:
    """Wall seconds from the first request sent to the last."""
    if len(results) < 2:
        return 0.0
    starts = [r.start for r in results]
    return max(starts) - min(starts)


def prefill_seconds(delta: ReplicaCounters) -> float:
    """Simulated GPU seconds a replica spent in prefill, estimated from its counters.

    The simulator's own roofline applied to an average request (its uncached tokens attending to its cached
    ones), times the request count: each prefill counted as its own batch, so batching makes it an upper bound.
    """
    if delta.requests <= 0:
        return 0.0
    preset = get_preset(PRESET)
    uncached = (delta.prompt_tokens - delta.cached_tokens) / delta.requests
    cached = delta.cached_tokens / delta.requests
    return delta.requests * timing.prefill_seconds(preset, [(round(uncached), round(cached))])


# Rendering ------------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _cells(fig: RunFigures | None) -> list[str]:
    if fig is None:
        return ["-"] * 5
    goodput = f"{fig.goodput_rps:.1f}" + (f" ({fig.slo_pct:.0f}%)" if fig.slo_pct is not None else "")
    if fig.failed:
        goodput += f" [{fig.failed} failed]"
    hit = _pct(fig.hit_rate)
    if fig.best_hit_rate is not None:
        hit += f" (of {_pct(fig.best_hit_rate)})"
    return [
        hit,
        f"{_ms(fig.ttft_p50_ms)} / {_ms(fig.ttft_p99_ms)}",
        f"{_ms(fig.tpot_p50_ms)} / {_ms(fig.tpot_p99_ms)}",
        goodput,
        "-" if fig.spread is None else f"{fig.spread:.2f}",
    ]


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


Rows = dict[str, dict[str, RunFigures | None]]
"""``rows[row label][workload name]``."""


def main_table(rows: Rows, workloads: Sequence[str], best: dict[str, float | None]) -> str:
    """One markdown table: a row per router and policy, five columns per workload, and the best-hit row."""
    header = ["router", "policy"]
    for name in workloads:
        header += [f"{name} hit", f"{name} TTFT p50 / p99 ms", f"{name} TPOT p50 / p99 ms"]
        header += [f"{name} goodput/s (SLO %)", f"{name} spread"]
    body = []
    for label, by_workload in rows.items():
        router, _, policy = label.partition(" ")
        cells = [router, policy]
        for name in workloads:
            cells += _cells(by_workload.get(name))
        body.append(cells)
    reference = ["best achievable", "1 replica, unbounded cache"]
    for name in workloads:
        reference += [_pct(best[name]) if name in best else "each row's (of ...)", "-", "-", "-", "-"]
    body.append(reference)
    return "\n".join(_markdown(header, body))


def details_table(rows: Rows, workloads: Sequence[str]) -> str:
    """Why a row looks the way it does: shares, estimated prefill load per replica, offered rate, timing checks."""
    header = [
        "router / policy",
        "workload",
        "requests ok / failed",
        "offered / done req/s",
        "replica shares %",
        "est. prefill busy % per replica",
        "est. prefill busy % measured",
        "ideal placement TTFT p99 ms",
        "same, turns kept home",
        "client hit",
        "E2E stretch",
        "TTFT overhead ms",
        "CPU cores own / other",
        "wall s",
    ]
    body = []
    for label, by_workload in rows.items():
        for name in workloads:
            fig = by_workload.get(name)
            if fig is None:
                continue
            stretch = "-" if fig.e2e_stretch is None else f"{fig.e2e_stretch:.3f}"
            if fig.e2e_stretch is not None and fig.e2e_stretch > STRETCH_WARN:
                stretch += " (lagged)"
            body.append(
                [
                    label,
                    name,
                    f"{fig.completed} / {fig.failed}",
                    f"{fig.offered_rps:.1f} / {fig.throughput_rps:.1f}",
                    " ".join(f"{share:.0f}" for share in fig.shares_pct),
                    " ".join(f"{busy:.0f}" for busy in fig.prefill_busy_pct),
                    "-" if fig.window_prefill_busy_pct is None else f"{fig.window_prefill_busy_pct:.0f}",
                    _ms(fig.ideal_ttft_p99_ms),
                    _ms(fig.sticky_ttft_p99_ms),
                    _pct(fig.client_hit_rate),
                    stretch,
                    _ms(fig.ttft_overhead_ms),
                    f"{fig.cpu_own_cores:.2f} / {fig.cpu_other_cores:.2f}"
                    + (" (busy machine)" if fig.cpu_other_cores > OTHER_CPU_WARN else ""),
                    f"{fig.wall_s:.0f}",
                ]
            )
    return "\n".join(_markdown(header, body))
