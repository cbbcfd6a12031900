"""The burst benchmark: the same traffic burst against replicas only, a hosted model only, and spillgate.

    .venv/bin/python -m tests.bench.burst [--quick] [--json FILE]

The schedule is ``spillgate bench --rate-schedule``: Poisson arrivals at 0.6x the replicas' capacity, then 3x
for ``--burst-seconds``, then 0.6x again. Each setup gets fresh processes: N simulated SGLang replicas
(``llama-3.1-8b-h100``) and/or one simulated hosted model (TTFT 350 ms, TPOT 12 ms), and a gateway whose one
route targets the replicas (``cache_aware``), the hosted model, or both (spillgate's spill defaults), for a
tenant whose SLO is TTFT 1 s / TPOT 50 ms. Same seed, so every setup gets the same prompts at the same times.

Time. The simulators run ``--time-scale`` x real time, so the run is shorter than what it simulates. Every
figure printed is in simulated time (wall / time scale): phases, rates, TTFTs, goodput. The gateway, which
measures wall time, is configured in wall units: SLO, hosted priors and prefill prior times the time scale.
The gateway's own work is not scaled, so its overhead counts 1 / time scale times over (a few ms of wall
time is ~10 ms simulated), which only makes the figures slightly pessimistic.

Why these sizes. On a 2-core machine the hosted path is the limit: the gateway relays hosted models through
litellm at ~33 ms of CPU per request plus ~0.8 ms per streamed token, and the hosted-only setup must carry
3x capacity through it during the burst. So the replicas are made slow in simulated terms without streaming
many tokens: long unique prompts (prefill-bound, ``--prompt-tokens``), short answers (``--output-tokens``)
and one running request per replica (``--max-running``; also keeps prefill from stalling other requests'
decode, so TPOT stays the model's). The script reports each process's CPU per phase and flags a saturated
gateway, so a run the machine could not drive says so.

Capacity. Unless ``--capacity-rps`` is given, it is measured on the replicas-only setup first: the
saturation throughput (closed loop, one request per running slot), then open-loop Poisson probes at
fractions of it; capacity is the highest probed rate whose requests all met the TTFT SLO (>= 99%).

Cost. Read from each gateway's ``/metrics``: ``spillgate_spend_usd_total`` by kind (hosted at the provider's
prices; replicas as GPU time, ``gpu_usd_per_hour`` over ``output_tokens_per_s``) and, for spillgate,
``spillgate_hosted_equivalent_usd_total``. ``output_tokens_per_s`` is derived from the measured capacity (a
replica's output tokens per simulated second at capacity), so a request's replica cost is the GPU time it
takes at capacity; the demo's 1,140 tokens/s belongs to a decode-heavy workload and would make these
prefill-heavy requests look ~100x cheaper on the GPUs than they are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from spillgate.gateway.bench import BenchConfig, GspKnobs, LevelResult, run_bench
from spillgate.gateway.bench.arrivals import RateSchedule, burst_spec, parse_rate_schedule
from spillgate.gateway.bench.client import RequestResult
from spillgate.gateway.bench.stats import percentile
from tests.bench.burst_stack import (
    API_KEY,
    HOSTED,
    ROUTE,
    SETUPS,
    SLO_TPOT_MS,
    SLO_TTFT_MS,
    WARMUP_ROUTE,
    GatewayCounters,
    Setup,
    Stack,
    StackSpec,
)
from tests.bench.compare_cluster import machine_busy_s
from tests.bench.report import load_average, machine_info

PEAK = 3.0
STEADY = 0.6
SATURATED_CORES = 0.9
"""A gateway busier than this in a phase was CPU-bound there: its latencies are the machine's, not the policy's."""
CONTENDED_CORES = 0.5
"""Other processes using more than this in a phase (on 2 cores) slowed the simulators and the gateway there."""
ATTAINMENT_TARGET_PCT = 99.0
COST_TARGET = 0.40


@dataclass(frozen=True)
class Options:
    replicas: int = 2
    time_scale: float = 0.3
    max_running: int = 1
    prompt_tokens: int = 10000
    output_tokens: int = 16
    burst_s: float = 60.0
    steady_s: float = 150.0
    capacity_rps: float | None = None
    probe_requests: int = 100
    saturation_s: float = 30.0
    request_timeout_s: float = 120.0
    seed: int = 0

    def wall(self, sim_s: float) -> float:
        return sim_s * self.time_scale

    def gsp(self) -> GspKnobs:
        """A short shared instruction, then a long document unique to the request: prefill-bound, uncached."""
        return GspKnobs(
            groups=8,
            prompts_per_group=64,
            system_tokens=64,
            question_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
        )


# Running the load --------------------------------------------------------------------------------------


async def bench(stack: Stack, opts: Options, *, seed: int, model: str = ROUTE, **shape: Any) -> LevelResult:
    """One level through the stack's gateway; ``shape`` holds the wall-clock load (rate, schedule, ...)."""
    config = BenchConfig(
        url=stack.url,
        api_key=API_KEY,
        model=model,
        workload="gsp",
        gsp=opts.gsp(),
        slo_ttft_ms=SLO_TTFT_MS * opts.time_scale,
        slo_tpot_ms=SLO_TPOT_MS * opts.time_scale,
        request_timeout_s=opts.wall(opts.request_timeout_s),
        seed=seed,
        **shape,
    )
    result = await run_bench(config)
    return result.levels[0]


def ttft_met(result: RequestResult, opts: Options) -> bool:
    return result.ok and result.ttft is not None and result.ttft <= SLO_TTFT_MS / 1000 * opts.time_scale


def slo_met(result: RequestResult, opts: Options) -> bool:
    tpot_ok = result.tpot is None or result.tpot <= SLO_TPOT_MS / 1000 * opts.time_scale
    return ttft_met(result, opts) and tpot_ok


def pct(part: int, whole: int) -> float | None:
    return 100.0 * part / whole if whole else None


@dataclass
class Capacity:
    """Requests per simulated second: saturation (closed loop) and capacity (highest rate meeting the SLO)."""

    saturation_rps: float | None
    capacity_rps: float
    probes: list[dict[str, Any]] = field(default_factory=list)
    how: str = ""


async def measure_capacity(opts: Options, spec: StackSpec, log_dir: Path) -> Capacity:
    """Saturation by a closed loop at one request per running slot, then Poisson probes at fractions of it."""
    stack = Stack(spec, SETUPS[0], log_dir / "capacity")
    stack.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        stack.start()
        slots = opts.replicas * opts.max_running
        closed = await bench(
            stack, opts, seed=opts.seed + 1000, concurrency=(slots,), duration_s=opts.wall(opts.saturation_s)
        )
        saturation = closed.summary.completed / (closed.summary.duration_s / opts.time_scale)
        done = closed.summary.completed
        _note(f"capacity: saturation {saturation:.2f} req/s (closed loop, {slots} in flight, {done} requests)")
        probes: list[dict[str, Any]] = []
        passed: dict[float, bool] = {}

        async def probe(fraction: float) -> bool:
            rate = fraction * saturation
            level = await bench(
                stack,
                opts,
                seed=opts.seed + 2000 + len(probes),
                rate=rate / opts.time_scale,
                num_requests=opts.probe_requests,
            )
            met = sum(1 for r in level.results if ttft_met(r, opts))
            attainment = pct(met, len(level.results)) or 0.0
            p99 = level.summary.ttft_ms.p99
            ok = attainment >= ATTAINMENT_TARGET_PCT and level.summary.failed == 0
            probes.append(
                {
                    "fraction_of_saturation": fraction,
                    "rate_rps": rate,
                    "requests": len(level.results),
                    "ttft_attainment_pct": attainment,
                    "ttft_p99_ms": None if p99 is None else p99 / opts.time_scale,
                    "passed": ok,
                }
            )
            _note(
                f"capacity: probe {rate:.2f} req/s ({fraction:.0%} of saturation): TTFT SLO met {attainment:.1f}%, "
                f"p99 {probes[-1]['ttft_p99_ms'] or float('nan'):.0f} ms -> {'holds' if ok else 'misses'}"
            )
            passed[fraction] = ok
            return ok

        fraction = 0.5
        if await probe(fraction):
            while fraction < 0.85 and await probe(round(fraction + 0.1, 2)):
                fraction = round(fraction + 0.1, 2)
        else:
            while fraction > 0.15:
                fraction = round(fraction - 0.1, 2)
                if await probe(fraction):
                    break
        best = max((f for f, ok in passed.items() if ok), default=min(passed))
        how = (
            f"highest of the probed rates (steps of 10% of the {saturation:.2f} req/s saturation throughput) whose "
            f"{opts.probe_requests} Poisson requests met the TTFT SLO >= {ATTAINMENT_TARGET_PCT:g}%"
        )
        return Capacity(saturation, best * saturation, probes, how)
    finally:
        stack.stop()


def _note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# One setup ---------------------------------------------------------------------------------------------


@dataclass
class SetupRun:
    setup: Setup
    level: LevelResult
    counters: GatewayCounters
    cpu_by_phase: list[dict[str, float]]
    health: dict[str, Any]
    wall_s: float


async def _sample_cpu(stack: Stack, bounds_wall: list[tuple[float, float]]) -> list[dict[str, float]]:
    """Cores each process (and everything else on the machine) used in each phase."""
    t0 = time.monotonic()
    marks = [(t0, stack.cpu_s(), machine_busy_s(), sum(os.times()[:2]))]
    for _, end in bounds_wall:
        await asyncio.sleep(max(0.0, t0 + end - time.monotonic()))
        marks.append((time.monotonic(), stack.cpu_s(), machine_busy_s(), sum(os.times()[:2])))
    out = []
    for (t_a, cpu_a, busy_a, own_a), (t_b, cpu_b, busy_b, own_b) in pairwise(marks):
        wall = max(t_b - t_a, 1e-9)
        cores = {name: (cpu_b[name] - cpu_a[name]) / wall for name in cpu_a}
        cores["load generator"] = (own_b - own_a) / wall
        cores["other work"] = max(0.0, (busy_b - busy_a) / wall - sum(cores.values()))
        out.append(cores)
    return out


async def run_setup(setup: Setup, opts: Options, spec: StackSpec, spec_text: str, log_dir: Path) -> SetupRun:
    stack = Stack(spec, setup, log_dir)
    started = time.monotonic()
    try:
        _note(f"{setup.name}: starting")
        stack.start()
        # A warm-up, as on a gateway that has been running. The first hosted call pays litellm's set-up (~0.2 s
        # of wall time, which the time scale turns into ~0.6 s simulated) and stalls the gateway's event loop
        # meanwhile, so it goes first, alone, on a hosted-only route; then one request per slot at a time
        # (no queueing), so the gateway's first latency samples for the replicas are clean ones.
        if setup.hosted:
            await bench(stack, opts, seed=opts.seed + 3000, model=WARMUP_ROUTE, concurrency=(1,), num_requests=2)
        slots = opts.replicas * opts.max_running
        warm = await bench(stack, opts, seed=opts.seed + 3001, concurrency=(slots,), num_requests=2 * slots)
        _note(f"{setup.name}: warm-up served by {dict(warm.summary.backends)}")
        before = stack.metrics()
        schedule = parse_rate_schedule(spec_text)
        sampler = asyncio.create_task(_sample_cpu(stack, schedule.bounds()))
        _note(f"{setup.name}: running the schedule ({schedule.duration_s:.0f} s wall)")
        level = await bench(stack, opts, seed=opts.seed, rate_schedule=spec_text)
        cpu = await sampler
        counters = stack.metrics().minus(before)
        health = stack.health()
    finally:
        stack.stop()
    return SetupRun(setup, level, counters, cpu, health, time.monotonic() - started)


# Figures -----------------------------------------------------------------------------------------------


def setup_figures(run: SetupRun, opts: Options, schedule_sim: RateSchedule) -> dict[str, Any]:
    """Everything the table and the JSON show for one setup, in simulated time."""
    ts = opts.time_scale
    results = run.level.results
    phases = run.level.phases
    burst = max(range(len(schedule_sim.phases)), key=lambda i: schedule_sim.phases[i].rate)
    steady = [i for i in range(len(phases)) if i != burst]

    def in_phase(index: int) -> list[RequestResult]:
        return [r for r in results if r.scheduled is not None and _phase_of(r, run) == index]

    def ttft_pct(rs: list[RequestResult]) -> float | None:
        return pct(sum(1 for r in rs if ttft_met(r, opts)), len(rs))

    ttfts = [r.ttft * 1000 / ts for r in results if r.ok and r.ttft is not None]
    per_phase = []
    for index, phase in enumerate(phases):
        rs = in_phase(index)
        hosted = [r for r in rs if r.backend == HOSTED]
        start_wall = phase.start_s
        per_phase.append(
            {
                "phase": index + 1,
                "start_s": start_wall / ts,
                "label": schedule_sim.phases[index].label,
                "rate_rps": schedule_sim.phases[index].rate,
                "seconds": schedule_sim.phases[index].duration_s,
                "requests": len(rs),
                "ttft_attainment_pct": ttft_pct(rs),
                "slo_attainment_pct": pct(sum(1 for r in rs if slo_met(r, opts)), len(rs)),
                "ttft_p50_ms": _p(rs, 50, ts),
                "ttft_p99_ms": _p(rs, 99, ts),
                "to_hosted": len(hosted),
                "last_to_hosted_at_s": max(((r.scheduled or 0.0) - start_wall) / ts for r in hosted)
                if hosted
                else None,
                "first_to_hosted_at_s": min(((r.scheduled or 0.0) - start_wall) / ts for r in hosted)
                if hosted
                else None,
                "reasons": dict(phase.summary.reasons),
                "errors": dict(phase.summary.errors),
                "cpu_cores": {k: round(v, 2) for k, v in run.cpu_by_phase[index].items()}
                if index < len(run.cpu_by_phase)
                else {},
            }
        )
    steady_results = [r for i in steady for r in in_phase(i)]
    met_both = sum(1 for r in results if slo_met(r, opts))
    hosted_all = sum(1 for r in results if r.backend == HOSTED)
    counters = run.counters
    gateway_peak = max((c.get("gateway", 0.0) for c in run.cpu_by_phase), default=0.0)
    return {
        "setup": run.setup.name,
        "targets": run.setup.targets,
        "requests": len(results),
        "failed": sum(1 for r in results if not r.ok),
        "ttft_attainment_pct": ttft_pct(results),
        "ttft_attainment_burst_pct": ttft_pct(in_phase(burst)),
        "ttft_attainment_steady_pct": ttft_pct(steady_results),
        "slo_attainment_pct": pct(met_both, len(results)),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "goodput_rps": met_both / schedule_sim.duration_s,
        "cost_usd": counters.total_usd,
        "spend_usd_by_kind": counters.spend_usd,
        "hosted_equivalent_usd": counters.hosted_equivalent_usd,
        "to_hosted": hosted_all,
        "to_hosted_pct": pct(hosted_all, len(results)),
        "to_hosted_steady": sum(1 for r in steady_results if r.backend == HOSTED),
        "steady_requests": len(steady_results),
        "reasons_metrics": counters.by_reason(),
        "reasons_client": dict(run.level.summary.reasons),
        "phases": per_phase,
        "gateway_peak_cores": gateway_peak,
        "gateway_saturated": gateway_peak > SATURATED_CORES,
        "gateway_view_after": _gateway_view(run.health, ts),
        "wall_s": run.wall_s,
        "request_log": [
            {
                "at_s": round((r.scheduled or 0.0) / ts, 3),
                "phase": (_phase_of(r, run) or 0) + 1,
                "steady": _phase_of(r, run) != burst,
                "backend": r.backend,
                "reason": r.reason,
                "ttft_ms": None if r.ttft is None else round(r.ttft * 1000 / ts, 1),
                "tpot_ms": None if r.tpot is None else round(r.tpot * 1000 / ts, 2),
                "e2e_ms": round(r.e2e * 1000 / ts, 1),
                "error": r.error,
            }
            for r in sorted(results, key=lambda r: r.scheduled or 0.0)
        ],
    }


def _gateway_view(health: dict[str, Any], ts: float) -> dict[str, dict[str, Any]]:
    """What the gateway believed about each backend at the end (``/health``), in simulated units: the
    figures its spill predictions use."""
    out = {}
    for name, b in health.get("backends", {}).items():
        out[name] = {
            "ttft_ms": round(b.get("ttft_ms", 0.0) / ts, 1),
            "tpot_ms": round(b.get("tpot_ms", 0.0) / ts, 2),
            "prefill_tokens_per_s": round(b.get("prefill_tokens_per_s", 0.0) * ts),
            "max_running": b.get("max_running"),
        }
    return out


def _phase_of(result: RequestResult, run: SetupRun) -> int | None:
    for phase in run.level.phases:
        if result.scheduled is not None and phase.start_s <= result.scheduled < phase.end_s:
            return phase.index
    return None


def _p(results: list[RequestResult], q: float, ts: float) -> float | None:
    values = [r.ttft * 1000 / ts for r in results if r.ok and r.ttft is not None]
    return percentile(values, q)


# Report ------------------------------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{fmt}}{suffix}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    hosted_only = next((r["cost_usd"] for r in rows if r["setup"] == "hosted only"), None)
    header = (
        "| setup | TTFT SLO met, whole run | TTFT SLO met, burst | TTFT p50 / p99 ms | goodput req/s | cost USD "
        "| cost vs hosted only | sent to hosted | to hosted in steady phases |"
    )
    lines = [header, "| --- | " + " | ".join(["---:"] * 8) + " |"]
    for r in rows:
        ratio = r["cost_usd"] / hosted_only if hosted_only else None
        name = f"**{r['setup']}**" if r["setup"] == "spillgate" else r["setup"]
        whole, burst = _num(r["ttft_attainment_pct"], ".1f", "%"), _num(r["ttft_attainment_burst_pct"], ".1f", "%")
        lines.append(
            f"| {name} | {whole} | {burst} "
            f"| {_num(r['ttft_p50_ms'], '.0f')} / {_num(r['ttft_p99_ms'], '.0f')} | {r['goodput_rps']:.2f} "
            f"| {r['cost_usd']:.3f} | {_num(None if ratio is None else 100 * ratio, '.1f', '%')} "
            f"| {_num(r['to_hosted_pct'], '.1f', '%')} | {r['to_hosted_steady']} of {r['steady_requests']} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    by = {r["setup"]: r for r in rows}
    spill, replicas, hosted = by.get("spillgate"), by.get("replicas only"), by.get("hosted only")
    out = []
    if spill:
        burst = spill["ttft_attainment_burst_pct"] or 0.0
        whole = spill["ttft_attainment_pct"] or 0.0
        out.append(
            f"- spillgate keeps TTFT SLO attainment >= {ATTAINMENT_TARGET_PCT:g}% through the burst: "
            f"{'MET' if burst >= ATTAINMENT_TARGET_PCT else 'MISSED'} (burst {burst:.1f}%, whole run {whole:.1f}%)"
        )
    if replicas:
        burst = replicas["ttft_attainment_burst_pct"] or 0.0
        out.append(
            f"- replicas only does not: {'as expected' if burst < ATTAINMENT_TARGET_PCT else 'UNEXPECTEDLY IT DID'} "
            f"(burst {burst:.1f}%, steady phases {_num(replicas['ttft_attainment_steady_pct'], '.1f', '%')})"
        )
    if spill and hosted and hosted["cost_usd"] > 0:
        ratio = spill["cost_usd"] / hosted["cost_usd"]
        equivalent = spill["hosted_equivalent_usd"]
        out.append(
            f"- spillgate spends <= {COST_TARGET:.0%} of hosted only: {'MET' if ratio <= COST_TARGET else 'MISSED'} "
            f"(${spill['cost_usd']:.3f} vs ${hosted['cost_usd']:.3f}: {ratio:.1%}; vs its own hosted-equivalent "
            f"${equivalent:.3f}: {spill['cost_usd'] / max(equivalent, 1e-12):.1%})"
        )
    if spill:
        out.append(
            f"- spillgate sends nothing to hosted when the replicas can meet the SLO: "
            f"{'MET' if spill['to_hosted_steady'] == 0 else 'MISSED'} ({spill['to_hosted_steady']} of "
            f"{spill['steady_requests']} steady-phase requests went to hosted)"
        )
        out.extend(steady_spill_lines(spill, replicas))
    return out


def steady_spill_lines(spill: dict[str, Any], replicas: dict[str, Any] | None) -> list[str]:
    """Each steady phase's spills: when, how busy the replicas were, and (before the burst, where both runs
    are in the same state) how the replicas-only run served the very same requests."""
    log = spill["request_log"]
    served = [(r["at_s"], r["at_s"] + r["e2e_ms"] / 1000) for r in log if r["backend"] != HOSTED and not r["error"]]
    by_time = {r["at_s"]: r for r in replicas["request_log"]} if replicas else {}
    burst_phase = max(spill["phases"], key=lambda p: p["rate_rps"])["phase"]
    out = []
    for phase in spill["phases"]:
        spills = [r for r in log if r["phase"] == phase["phase"] and r["steady"] and r["backend"] == HOSTED]
        if not spills:
            continue
        busy = [sum(1 for a, b in served if a <= r["at_s"] < b) for r in spills]
        when = "before" if phase["phase"] < burst_phase else "after"
        line = (
            f"  phase {phase['phase']} ({when} the burst): {len(spills)} spilled, at +"
            + ", +".join(f"{r['at_s'] - phase['start_s']:.1f}" for r in spills)
            + f" s; replicas busy then (requests in flight): {', '.join(map(str, busy))}"
        )
        if when == "before" and by_time:
            same = [by_time[r["at_s"]] for r in spills if r["at_s"] in by_time]
            ttfts = [r["ttft_ms"] for r in same if r["ttft_ms"] is not None]
            met = sum(1 for t in ttfts if t <= SLO_TTFT_MS)
            line += (
                f"; replicas only served the same requests with TTFT {', '.join(f'{t:.0f}' for t in ttfts)} ms "
                f"({met} of {len(same)} within the SLO)"
            )
        out.append(line)
    return out


def validity(rows: list[dict[str, Any]]) -> list[str]:
    """Phases where the gateway was CPU-bound or other work crowded the machine: their latencies are suspect."""
    out = []
    for r in rows:
        for p in r["phases"]:
            cores = p["cpu_cores"]
            if cores.get("gateway", 0.0) > SATURATED_CORES:
                out.append(
                    f"- {r['setup']}, phase {p['phase']}: the gateway used {cores['gateway']:.2f} cores (CPU-bound)"
                )
            if cores.get("other work", 0.0) > CONTENDED_CORES:
                out.append(
                    f"- {r['setup']}, phase {p['phase']}: other processes used {cores['other work']:.2f} of the "
                    "machine's cores; latencies there include CPU contention (x 1 / time scale in simulated time)"
                )
    return out


def phase_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        out.append(f"{r['setup']}: reasons (/metrics) {_fmt_counts(r['reasons_metrics'])}")
        for p in r["phases"]:
            when = ""
            if p["to_hosted"]:
                first, last = p["first_to_hosted_at_s"], p["last_to_hosted_at_s"]
                when = f" (first +{first:.1f} s, last +{last:.1f} s into the phase)"
            cpu = ", ".join(f"{k} {v:.2f}" for k, v in p["cpu_cores"].items() if v >= 0.01)
            out.append(
                f"  phase {p['phase']} {p['label']} {p['rate_rps']:.2f} req/s x {p['seconds']:g} s: "
                f"{p['requests']} sent, "
                f"TTFT SLO {_num(p['ttft_attainment_pct'], '.1f', '%')}, p50/p99 {_num(p['ttft_p50_ms'], '.0f')}/"
                f"{_num(p['ttft_p99_ms'], '.0f')} ms, to hosted {p['to_hosted']}{when}; "
                f"reasons {_fmt_counts(p['reasons'])}; cores: {cpu}"
                + (f"; errors {_fmt_counts(p['errors'])}" if p["errors"] else "")
            )
        view = "; ".join(
            f"{name} TTFT {v['ttft_ms']:g} ms, TPOT {v['tpot_ms']:g} ms"
            + (f", prefill {v['prefill_tokens_per_s']:,} tok/s" if v["max_running"] else "")
            for name, v in r["gateway_view_after"].items()
        )
        out.append(f"  the gateway's view at the end (/health, simulated units): {view}")
        for name, v in r["gateway_view_after"].items():
            if v["max_running"] and v["tpot_ms"] > SLO_TPOT_MS:
                out.append(
                    f"  ! the gateway's TPOT estimate for {name} ({v['tpot_ms']:g} ms) is above the TPOT SLO "
                    f"({SLO_TPOT_MS:g} ms): every request is predicted to miss there, and only requests it serves "
                    "would update the estimate"
                )
    return out


def _fmt_counts(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def min_hosted_share(schedule_sim: RateSchedule, capacity: float) -> float:
    """The smallest share of requests that must leave the replicas if they serve exactly their capacity."""
    total = sum(p.rate * p.duration_s for p in schedule_sim.phases)
    excess = sum(max(0.0, p.rate - capacity) * p.duration_s for p in schedule_sim.phases)
    return excess / total if total else 0.0


# Main --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[Options, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter phases and probes (~3 minutes)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    parser.add_argument("--replicas", type=int, default=Options.replicas)
    parser.add_argument(
        "--time-scale", type=float, default=Options.time_scale, help="wall seconds per simulated second"
    )
    parser.add_argument("--max-running", type=int, default=Options.max_running, help="running requests per replica")
    parser.add_argument("--prompt-tokens", type=int, default=Options.prompt_tokens)
    parser.add_argument("--output-tokens", type=int, default=Options.output_tokens)
    parser.add_argument("--burst-seconds", type=float, default=None, help="simulated; default 60 (quick: 20)")
    parser.add_argument("--steady-seconds", type=float, default=None, help="each steady phase; default 150 (quick: 50)")
    parser.add_argument(
        "--capacity-rps", type=float, default=None, help="the replicas' capacity, req/simulated s: skips measuring it"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--setups", default="replicas only,hosted only,spillgate", help="comma list, a subset of the three"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    opts = Options(
        replicas=args.replicas,
        time_scale=args.time_scale,
        max_running=args.max_running,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        burst_s=args.burst_seconds if args.burst_seconds is not None else (20.0 if quick else 60.0),
        steady_s=args.steady_seconds if args.steady_seconds is not None else (50.0 if quick else 150.0),
        capacity_rps=args.capacity_rps,
        probe_requests=50 if quick else Options.probe_requests,
        saturation_s=15.0 if quick else Options.saturation_s,
        seed=args.seed,
    )
    return opts, args


async def main_async(opts: Options, args: argparse.Namespace) -> int:
    started = time.monotonic()
    setups = [s for s in SETUPS if s.name in {n.strip() for n in args.setups.split(",")}]
    log_dir = Path(tempfile.mkdtemp(prefix="spillgate-burst-"))
    _note(f"logs in {log_dir}")
    spec_text_sim = burst_spec(opts.burst_s, opts.steady_s, STEADY, PEAK)
    draft = StackSpec(opts.replicas, opts.time_scale, opts.max_running, output_tokens_per_s=1140.0)
    if opts.capacity_rps is not None:
        capacity = Capacity(None, opts.capacity_rps, how="given with --capacity-rps")
    else:
        capacity = await measure_capacity(opts, draft, log_dir)
    per_replica_tokens = capacity.capacity_rps * opts.output_tokens / opts.replicas
    spec = StackSpec(opts.replicas, opts.time_scale, opts.max_running, output_tokens_per_s=per_replica_tokens)
    schedule_sim = parse_rate_schedule(spec_text_sim, capacity.capacity_rps)
    # The same schedule in wall units: rates / time scale, durations x time scale.
    spec_text_wall = ",".join(
        f"{p.rate / opts.time_scale:.6g}:{p.duration_s * opts.time_scale:.6g}" for p in schedule_sim.phases
    )
    _note(f"schedule: {schedule_sim.describe()} (simulated; wall: {spec_text_wall})")
    runs = []
    for setup in setups:
        runs.append(await run_setup(setup, opts, spec, spec_text_wall, log_dir))
    rows = [setup_figures(run, opts, schedule_sim) for run in runs]
    runtime = time.monotonic() - started

    command = shlex.join([".venv/bin/python", "-m", "tests.bench.burst", *sys.argv[1:]])
    machine = machine_info()
    print(markdown_table(rows))
    print()
    print(
        f"Schedule (simulated time): {schedule_sim.describe()}; capacity {capacity.capacity_rps:.2f} req/s "
        f"({capacity.how}"
        + (f"; saturation {capacity.saturation_rps:.2f} req/s" if capacity.saturation_rps else "")
        + f"). {opts.replicas} replicas ({opts.max_running} running request each), time scale {opts.time_scale:g}; "
        f"prompts {opts.prompt_tokens} tokens unique + 64 shared, {opts.output_tokens} output tokens. SLO TTFT "
        f"{SLO_TTFT_MS:g} ms / TPOT {SLO_TPOT_MS:g} ms; goodput counts both. Times and rates are simulated "
        f"(wall / {opts.time_scale:g}). At least {min_hosted_share(schedule_sim, capacity.capacity_rps):.1%} of "
        "the requests must leave the replicas if they serve exactly their capacity during the burst."
    )
    print(
        f"Cost: gateway /metrics spend (replica GPU time at ${spec.output_tokens_per_s:.2f} output tokens/s per "
        f"replica = capacity x output tokens / replicas, $3/h; hosted $3/$15 per Mtok). Provisioned GPUs cost "
        f"{opts.replicas} x $3/h x {schedule_sim.duration_s:g} s = "
        f"${opts.replicas * 3.0 * schedule_sim.duration_s / 3600:.3f} whether used or not."
    )
    if warnings := validity(rows):
        print()
        print("Validity (the machine, not the policy):")
        print("\n".join(warnings))
    print()
    print("Targets:")
    print("\n".join(verdicts(rows)))
    print()
    print("Per phase (simulated time; scheduled arrival decides the phase):")
    print("\n".join(phase_lines(rows)))
    print()
    print(
        f"Machine: {machine['nproc']} cores ({machine['cpu_model']}), Python {machine['python']}, "
        f"load average now {load_average()}"
    )
    print(f"Command: {command}")
    print(f"Runtime: {runtime:.0f} s wall; logs and gateway configs in {log_dir}")
    if args.json is not None:
        document = {
            "version": 1,
            "command": command,
            "machine": machine,
            "options": asdict(opts),
            "capacity": asdict(capacity),
            "schedule_sim": spec_text_sim,
            "schedule_wall": spec_text_wall,
            "output_tokens_per_s_per_replica": spec.output_tokens_per_s,
            "min_hosted_share": min_hosted_share(schedule_sim, capacity.capacity_rps),
            "setups": rows,
            "runtime_s": runtime,
            "gateway_configs": {
                run.setup.name: str(log_dir / f"{run.setup.name.replace(' ', '-')}-gateway.yaml") for run in runs
            },
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    opts, args = parse_args(argv)
    return asyncio.run(main_async(opts, args))


if __name__ == "__main__":
    sys.exit(main())
