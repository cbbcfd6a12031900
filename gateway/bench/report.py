"""Present a ``BenchResult``: a table for people (stdout) and a JSON document for scripts (``--json``).

JSON layout (``version`` 1)::

    {"version": 1, "model", "started_at", "interrupted", "config": {... every BenchConfig field, "mode"},
     "levels": [{"label", "concurrency", "rate",
                 "requests": {"completed", "failed", "unfinished"}, "duration_s",
                 "request_throughput_rps", "output_throughput_tps", "goodput_rps", "slo_attainment_pct",
                 "ttft_ms" | "tpot_ms" | "e2e_ms": {"p50", "p95", "p99", "mean", "count"},
                 "tokens": {"prompt", "completion", "cached"}, "cache_hit_rate",
                 "backends": {name: {"requests", "share_pct"}}, "reasons": {x-spillgate-reason: requests},
                 "errors": {kind: {"count", "example"}},
                 "warmup": {"seconds", "requests"},
                 "phases": [{"index", "label", "rate", "start_s", "end_s", ... the same figures as a level}]}]}

Times are milliseconds, rates per second, ``cache_hit_rate`` a fraction in [0, 1] (``null`` without usage).
``phases`` is empty except under a rate schedule: one entry per phase, over the requests it sent, its rates
per second of the phase; ``rate`` there is the phase's resolved rate and ``label`` the rate as written.
A level's figures leave out the ``warmup.requests`` sent in its first ``warmup.seconds`` (phases count them).
"""

from __future__ import annotations

from typing import Any

from spillgate.gateway.bench.api import BenchResult, LevelResult
from spillgate.gateway.bench.stats import Distribution, PhaseSummary, Summary

JSON_VERSION = 1


def to_json(result: BenchResult) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "model": result.model,
        "started_at": result.started_at,
        "interrupted": result.interrupted,
        "config": result.config.to_dict(),
        "levels": [_level_json(level) for level in result.levels],
    }


def _distribution(dist: Distribution) -> dict[str, Any]:
    return {"p50": dist.p50, "p95": dist.p95, "p99": dist.p99, "mean": dist.mean, "count": dist.count}


def _level_json(level: LevelResult) -> dict[str, Any]:
    return {
        "label": level.label,
        "concurrency": level.concurrency,
        "rate": level.rate,
        **_summary_json(level.summary),
        "warmup": {"seconds": level.warmup_s, "requests": level.warmup_requests},
        "phases": [_phase_json(phase) for phase in level.phases],
    }


def _phase_json(phase: PhaseSummary) -> dict[str, Any]:
    return {
        "index": phase.index,
        "label": phase.label,
        "rate": phase.rate,
        "start_s": phase.start_s,
        "end_s": phase.end_s,
        **_summary_json(phase.summary),
    }


def _summary_json(s: Summary) -> dict[str, Any]:
    return {
        "requests": {"completed": s.completed, "failed": s.failed, "unfinished": s.unfinished},
        "duration_s": s.duration_s,
        "request_throughput_rps": s.request_throughput,
        "output_throughput_tps": s.output_throughput,
        "goodput_rps": s.goodput,
        "slo_attainment_pct": s.slo_attainment_pct,
        "ttft_ms": _distribution(s.ttft_ms),
        "tpot_ms": _distribution(s.tpot_ms),
        "e2e_ms": _distribution(s.e2e_ms),
        "tokens": {"prompt": s.prompt_tokens, "completion": s.completion_tokens, "cached": s.cached_tokens},
        "cache_hit_rate": s.cache_hit_rate,
        "backends": {
            name: {"requests": count, "share_pct": s.backend_shares_pct[name]} for name, count in s.backends.items()
        },
        "reasons": dict(s.reasons),
        "errors": {kind: {"count": n, "example": s.error_examples.get(kind, "")} for kind, n in s.errors.items()},
    }


# Table -------------------------------------------------------------------------------------------------

_COLUMNS = (
    "level",
    "ok",
    "err",
    "req/s",
    "out tok/s",
    "goodput/s",
    "SLO %",
    "TTFT ms p50/p95/p99",
    "TPOT ms p50/p95/p99",
    "E2E ms p50/p95/p99",
    "cache hit",
)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _percentiles(dist: Distribution) -> str:
    return "/".join(_ms(value) for value in (dist.p50, dist.p95, dist.p99))


def _row(label: str, s: Summary) -> list[str]:
    return [
        label,
        str(s.completed),
        str(s.failed),
        f"{s.request_throughput:.2f}",
        f"{s.output_throughput:.0f}",
        f"{s.goodput:.2f}",
        "-" if s.slo_attainment_pct is None else f"{s.slo_attainment_pct:.1f}",
        _percentiles(s.ttft_ms),
        _percentiles(s.tpot_ms),
        _percentiles(s.e2e_ms),
        "-" if s.cache_hit_rate is None else f"{100 * s.cache_hit_rate:.1f}%",
    ]


def _shares(s: Summary) -> str:
    return ", ".join(f"{name} {share:.1f}%" for name, share in s.backend_shares_pct.items()) or "-"


def _reasons(s: Summary) -> str:
    """``overflow 12, least_ttft 80``; empty when the server named no reason (not a spillgate gateway)."""
    if set(s.reasons) <= {"-"}:
        return ""
    return ", ".join(f"{reason} {count}" for reason, count in s.reasons.items())


def format_table(result: BenchResult) -> str:
    """The report: a header, one row per level (and per phase of a schedule), then backend shares, reasons
    and errors."""
    config = result.config
    lines = [
        f"spillgate bench: {config.workload} -> {', '.join(config.urls)} (model {result.model}); "
        f"SLO TTFT <= {config.slo_ttft_ms:g} ms, TPOT <= {config.slo_tpot_ms:g} ms"
        + ("  [interrupted: partial results]" if result.interrupted else ""),
    ]
    if config.rate_schedule is not None:
        lines.append(f"rate schedule: {config.schedule().describe()}")
    lines.append("")
    rows = [list(_COLUMNS)]
    for level in result.levels:
        rows.append(_row(level.label, level.summary))
        rows.extend(_row(f"  {phase.index + 1}: {phase.label}", phase.summary) for phase in level.phases)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    for number, row in enumerate(rows):
        cells = [cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.append("")
    for level in result.levels:
        s = level.summary
        extra = f"  unfinished {s.unfinished}" if s.unfinished else ""
        lines.append(f"{level.label}: {s.duration_s:.1f}s, backends: {_shares(s)}{extra}")
        if level.warmup_s:
            lines.append(
                f"  warm-up: the {level.warmup_requests} requests sent in the first {level.warmup_s:g}s are not counted"
            )
        if reasons := _reasons(s):
            lines.append(f"  reasons: {reasons}")
        for phase in level.phases:
            p = phase.summary
            reasons = _reasons(p)
            lines.append(
                f"  phase {phase.index + 1} ({phase.label}, {phase.rate:.3g}/s, {phase.start_s:g}-{phase.end_s:g}s): "
                f"{p.finished} sent, backends: {_shares(p)}" + (f"; reasons: {reasons}" if reasons else "")
            )
        for kind, count in s.errors.items():
            example = s.error_examples.get(kind, "")
            lines.append(f"  error {kind} x{count}" + (f": {example}" if example else ""))
    return "\n".join(lines)
