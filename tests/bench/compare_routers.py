"""Spillgate's routing policies against sglang-router 0.3.2, in front of the same simulated SGLang replicas.

Starts N simulated replicas once, then puts each router in front of them in turn (sglang-router cache_aware
and round_robin, spillgate with each of its policies), a fresh router process per run, the replicas' prefix
caches flushed before each, and sends the same ``spillgate bench`` workloads at the same Poisson rate. One
markdown table: cluster cache hit rate, TTFT and TPOT p50/p99, goodput and per-replica share spread per
workload, plus the best achievable hit rate (the same requests, one at a time, to one replica whose cache
holds everything).

Time: the replicas run ``--time-scale`` wall seconds per simulated second; rates, durations, SLOs and every
reported time are simulated (measured wall times divided by the time scale). The scale is above 1 (slower
than real time) because on a small machine the cluster can only be made busy that way: an H100-class replica
prefills ~30k tokens/s, far more prompts than two cores can tokenize, relay and stream at real time.

    .venv/bin/python -m tests.bench.compare_routers [--replicas 4] [--time-scale 6] [--workloads gsp,gsp-zipf,chat]
        [--rate gsp=110,gsp-zipf=210,chat=70] [--duration 4] [--warmup 0] [--repeat 1] [--json FILE]
        [--skip-router] [--find-rate]

About 11 minutes at the defaults on 2 cores (21 runs of ~30 s wall). ``--find-rate`` sweeps rates through the
cache-aware reference router instead and suggests one (``--rate gsp=100/130/160`` picks the rates).

Every process is stopped by the PID it was started with, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from spillgate.backends.sim.presets import get_preset
from spillgate.gateway.bench.api import LevelResult, after_warmup, run_bench
from spillgate.gateway.bench.config import SESSION_ORDERS, BenchConfig
from spillgate.gateway.bench.stats import Slo, percentile
from tests.bench import report, router_env
from tests.bench.compare_cluster import (
    MODEL,
    PRESET,
    ROUTER_POLICIES,
    SIM_PREFILL_TOKENS_PER_S,
    SLO_TPOT_MS,
    SLO_TTFT_MS,
    SPILLGATE_POLICIES,
    Cluster,
    CpuWatch,
    Relay,
    ReplicaCounters,
    start_router,
    start_spillgate,
    wait_for_quiet,
)
from tests.bench.compare_table import Rows, RunFigures, details_table, figures, main_table
from tests.bench.compare_workloads import SWEEP_RATES, WorkloadSpec, parse_rates, workload_spec
from tests.bench.ideal_placement import IdealRequest, ideal_ttfts, sticky_ttfts
from tests.bench.services import REPO_ROOT, run_script
from tests.support.redis_server import redis_url as private_redis

REFERENCE_TIME_SCALE = 0.01
"""The best-hit reference runs one request at a time, where timing cannot change the hit rate: run it fast."""
SATURATION_TTFT_FACTOR = 3.0
"""``--find-rate``: the cluster is saturated once the median TTFT is this many times the lightest rate's."""
BUSY_TARGET = 0.7
HIT_RATE_TOLERANCE = 1e-4
"""'Never below the router's hit rate' is judged to 0.01 points: the same requests can differ by a cached token
or two between runs (one chat run: 195,337 against 195,338 of 485,048 prompt tokens, with no request moved)."""


@dataclass
class Settings:
    replicas: int
    time_scale: float
    duration_s: float
    specs: list[WorkloadSpec]
    spillgate_policies: list[str]
    router_policies: list[str]
    router_python: str | None
    router_note: str
    work_dir: Path
    sweep_rates: dict[str, list[float]] = field(default_factory=dict)
    trace_dir: Path | None = None
    """Where to keep per-request data: the client's results for every run, the gateway's decisions for spillgate."""
    session_order: str = "random"
    repeat: int = 1
    """Runs per row and workload, seeds 0..repeat-1, pooled: a p99 over ~300 requests is the 3rd slowest one."""
    warmup_s: float = 0.0
    """Simulated seconds of arrivals sent before ``duration_s``, not counted in latencies and goodput."""
    route: dict[str, Any] = field(default_factory=dict)
    """More settings for spillgate's route (``--route``): ``weights``, ``affinity``."""
    gateways: int = 1
    """spillgate's rows: gateway processes sharing their state through Redis, the bench rotating over them."""
    redis_url: str | None = None

    def sent_s(self) -> float:
        """Simulated seconds of arrivals per run, warm-up included."""
        return self.warmup_s + self.duration_s

    def slo(self) -> tuple[float, float]:
        return SLO_TTFT_MS, SLO_TPOT_MS


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


# Runs -----------------------------------------------------------------------------------------------


def start_relay(settings: Settings, cluster: Cluster, router: str, policy: str, trace: Path | None = None) -> Relay:
    if router == "sglang-router":
        assert settings.router_python is not None
        return start_router(settings.router_python, cluster, policy)
    return start_spillgate(
        cluster, policy, trace, settings.route, processes=settings.gateways, redis_url=settings.redis_url
    )


def spillgate_traces(trace_dir: Path, workload: str, kind: str) -> list[Path]:
    """The ``kind`` traces (``client`` or ``gateway``) of spillgate's runs of ``workload`` (a glob) in a
    ``--trace-dir``, for the scripts that read them; exits with a hint if there are none."""
    paths = sorted(trace_dir.glob(f"spillgate-*-{workload}-{kind}.jsonl"))
    if not paths:
        raise SystemExit(f"no spillgate {kind} traces of {workload} in {trace_dir} (compare_routers --trace-dir)")
    return paths


def _trace_path(
    settings: Settings, router: str, policy: str, spec: WorkloadSpec, kind: str, seed: int = 0
) -> Path | None:
    if settings.trace_dir is None:
        return None
    settings.trace_dir.mkdir(parents=True, exist_ok=True)
    run = f"-seed{seed}" if settings.repeat > 1 else ""
    return settings.trace_dir / f"{router}-{policy}-{spec.name}{run}-{kind}.jsonl"


def _write_client_results(path: Path | None, level: Any, time_scale: float) -> None:
    """Each request as the client saw it, times in simulated seconds."""
    if path is None:
        return
    with path.open("w") as out:
        for r in level.results:
            row = {
                "start": r.start / time_scale,
                "ok": r.ok,
                "backend": r.backend,
                "reason": r.reason,
                "ttft": None if r.ttft is None else r.ttft / time_scale,
                "e2e": r.e2e / time_scale,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "error": r.error,
                "session": r.session,
            }
            out.write(json.dumps(row) + "\n")


@dataclass
class Run:
    """One run of a row on one workload, before its figures are pooled with the row's other repeats."""

    level: LevelResult
    deltas: list[ReplicaCounters]
    wall_s: float
    cpu: tuple[float, float]
    slo: Slo
    probed: Any = None
    """What ``measure``'s ``probe`` read from the relay at the run's end, before it was stopped."""


def measure(
    settings: Settings,
    cluster: Cluster,
    router: str,
    policy: str,
    spec: WorkloadSpec,
    seed: int = 0,
    *,
    starter: Callable[[Path | None], Relay] | None = None,
    probe: Callable[[Relay], Any] | None = None,
) -> Run:
    """One run: a fresh router, flushed caches, the workload, the replicas' counters around it. ``starter``
    starts the relay instead of :func:`start_relay` (given the gateway trace path, if any); ``probe`` reads
    something from it once the workload is done (kept as ``Run.probed``)."""
    wait_for_quiet()
    trace = _trace_path(settings, router, policy, spec, "gateway", seed)
    if trace is not None:
        trace.unlink(missing_ok=True)
    relay = starter(trace) if starter is not None else start_relay(settings, cluster, router, policy, trace)
    probed = None
    try:
        cluster.flush()
        before = cluster.counters()
        config = spec.bench_config(
            relay.url,
            more_urls=relay.more_urls,
            model=relay.model,
            api_key=relay.api_key,
            time_scale=settings.time_scale,
            duration_s=settings.duration_s,
            slo=settings.slo(),
            warmup_s=settings.warmup_s,
            session_order=settings.session_order,
            seed=seed,
        )
        started = time.monotonic()
        watch = CpuWatch((*(service.pid for service in relay.services), *(service.pid for service in cluster.services)))
        result = asyncio.run(run_bench(config))
        wall = time.monotonic() - started
        cpu = watch.cores()
        if not relay.running():
            raise RuntimeError(f"{relay.name} exited during the run:\n{relay.log_tail()}")
        after = cluster.counters()
        if probe is not None:
            probed = probe(relay)
    finally:
        relay.stop()
    level = result.levels[0]
    _write_client_results(_trace_path(settings, router, policy, spec, "client", seed), level, settings.time_scale)
    deltas = [a.minus(b) for a, b in zip(after, before, strict=True)]
    return Run(level, deltas, wall, cpu, Slo(ttft_ms=config.slo_ttft_ms, tpot_ms=config.slo_tpot_ms), probed)


def measure_row(
    settings: Settings, cluster: Cluster, router: str, policy: str, spec: WorkloadSpec
) -> tuple[RunFigures, list[Run]]:
    """A row's cell group: ``settings.repeat`` runs (seeds 0..repeat-1) and their pooled figures."""
    runs = [measure(settings, cluster, router, policy, spec, seed) for seed in range(settings.repeat)]
    return pooled(runs, settings.time_scale), runs


def pooled(runs: list[Run], time_scale: float) -> RunFigures:
    """One row's figures over its repeats: requests pooled, replica counters summed, CPU averaged."""
    deltas = runs[0].deltas
    for run in runs[1:]:
        deltas = [a.plus(b) for a, b in zip(deltas, run.deltas, strict=True)]
    fig = figures(
        [run.level for run in runs],
        deltas,
        slo=runs[0].slo,
        time_scale=time_scale,
        wall_s=sum(run.wall_s for run in runs),
    )
    fig.cpu_own_cores = sum(run.cpu[0] for run in runs) / len(runs)
    fig.cpu_other_cores = sum(run.cpu[1] for run in runs) / len(runs)
    return fig


class Reference:
    """One replica whose KV pool holds everything: the best achievable hit rate of a run's requests.

    The requests go one at a time, so no two sharing a prefix race each other. gsp sends the same requests
    in every row; which chat turns a run sends depends on its timing (a session is ready again only once its
    turn has answered), so each chat row gets its own reference, replaying that row's order of turns.
    """

    def __init__(self, work_dir: Path) -> None:
        self._cluster = Cluster(REFERENCE_TIME_SCALE, work_dir)
        self._capacity = 0

    def start(self) -> None:
        self._cluster.start(1, name="reference")
        self._capacity = self._cluster.capacity_tokens()

    def stop(self) -> None:
        self._cluster.stop()

    def replay(
        self, settings: Settings, spec: WorkloadSpec, seed: int = 0, script: tuple[int, ...] | None = None
    ) -> Replay:
        """``spec``'s requests under ``seed`` (``script``: that order of session turns), one at a time."""
        self._cluster.flush()
        before = self._cluster.counters()[0]
        config = BenchConfig(
            url=self._cluster.urls[0],
            workload=spec.workload,
            model=MODEL,
            concurrency=(1,),
            num_requests=len(script) if script is not None else spec.num_requests(settings.sent_s()),
            gsp=spec.gsp,
            chat=spec.chat,
            session_script=script,
            seed=seed,
            trace_block_tokens=spec.trace_block_tokens,
            trace_max_output_tokens=spec.trace_max_output,
        )
        level = asyncio.run(run_bench(config)).levels[0]
        summary = level.summary
        delta = self._cluster.counters()[0].minus(before)
        notes = []
        if summary.failed or summary.unfinished:
            notes.append(f"{spec.name}: {summary.failed + summary.unfinished} reference requests did not complete")
        stored = delta.prompt_tokens - delta.cached_tokens
        if script is None and stored > self._capacity:  # a script holds one conversation at a time
            notes.append(f"{spec.name}: {stored:,.0f} distinct tokens > the replica's {self._capacity:,} (evictions)")
        sent = sorted(level.results, key=lambda result: result.start)
        return Replay(
            hit_rate=delta.cached_tokens / delta.prompt_tokens if delta.prompt_tokens else None,
            requests=[(result.prompt_tokens, result.cached_tokens) for result in sent if result.ok],
            notes=notes,
        )


@dataclass(frozen=True)
class Replay:
    """What the best achievable reference made of one run's requests."""

    hit_rate: float | None
    requests: list[tuple[int, int]]
    """Prompt and cached tokens of each request, in the order replayed (failed ones left out)."""
    notes: list[str]


def session_script(level: LevelResult) -> tuple[int, ...] | None:
    """The sessions of a chat run's turns, for its reference; ``None`` for independent requests.

    Session by session (each session's turns in the order the run sent them): chat sessions share nothing but
    the chat template, so this order has the same best hit rate as the run's own, and the reference replica
    then holds one conversation at a time however long the run was, where the run's order would have it
    evict older conversations once they outgrow its KV pool.
    """
    sent = sorted(level.results, key=lambda result: result.start)
    if not sent or sent[0].session is None:
        return None
    return by_session(tuple(result.session for result in sent if result.session is not None))


def by_session(script: tuple[int, ...]) -> tuple[int, ...]:
    """Turns grouped by session, sessions in order of their first turn, each session's turns in order."""
    return tuple(script[index] for index in replay_order(script))


def replay_order(sessions: Sequence[int | None]) -> list[int]:
    """Which of a run's requests (in send order) the reference replays first, second, ...: the run's own order
    for independent requests, chat turns session by session (:func:`by_session`)."""
    if not sessions or sessions[0] is None:
        return list(range(len(sessions)))
    first: dict[int | None, int] = {}
    for session in sessions:
        first.setdefault(session, len(first))
    return sorted(range(len(sessions)), key=lambda index: first[sessions[index]])


def ideal_ttft_p99_ms(
    runs: list[Run], replays: list[Replay], replicas: int, time_scale: float, *, sticky: bool = False
) -> float | None:
    """TTFT p99 of the ideal placement (:mod:`tests.bench.ideal_placement`) of the runs' own requests, pooled
    as their own p99 is; ``sticky``: with each chat session's turns kept on one replica. ``None`` when a run and
    its replay do not hold the same requests."""
    preset = get_preset(PRESET)
    place = sticky_ttfts if sticky else ideal_ttfts
    ttfts: list[float] = []
    for run, replay in zip(runs, replays, strict=True):
        sent = sorted((result for result in run.level.results if result.ok), key=lambda result: result.start)
        if len(sent) != len(replay.requests):
            return None
        tokens = dict(zip(replay_order([result.session for result in sent]), replay.requests, strict=True))
        requests = [
            IdealRequest(result.start / time_scale, *tokens[index], session=result.session)
            for index, result in enumerate(sent)
        ]
        ideal = place(requests, replicas, preset)
        ttfts += [ttft for ttft, result in zip(ideal, sent, strict=True) if after_warmup(result, run.level.warmup_s)]
    p99 = percentile(ttfts, 99)
    return None if p99 is None else 1000.0 * p99


def fixed_replays(settings: Settings, reference: Reference) -> dict[str, list[Replay]]:
    """The reference's replays, one per seed, of the workloads that send the same requests in every row (gsp,
    trace); chat rows each get their own (see :func:`compare`)."""
    replays: dict[str, list[Replay]] = {}
    for spec in settings.specs:
        if spec.workload == "chat":
            continue
        _progress(f"best achievable hit rate: {spec.name}")
        replays[spec.name] = [reference.replay(settings, spec, seed) for seed in range(settings.repeat)]
    return replays


def _mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def plan(settings: Settings) -> list[tuple[str, str]]:
    rows = []
    if settings.router_python is not None:
        rows += [("sglang-router", policy) for policy in settings.router_policies]
    rows += [("spillgate", policy) for policy in settings.spillgate_policies]
    return rows


def compare(
    settings: Settings, cluster: Cluster, reference: Reference, fixed: dict[str, list[Replay]], notes: list[str]
) -> Rows:
    rows: Rows = {}
    for router, policy in plan(settings):
        label = f"{router} {policy}"
        rows[label] = {}
        for spec in settings.specs:
            _progress(f"{label}: {spec.name}")
            fig, runs = measure_row(settings, cluster, router, policy, spec)
            replays = fixed.get(spec.name)
            if replays is None:  # chat: this row's own turns
                replays = []
                for seed, run in enumerate(runs):
                    replay = reference.replay(settings, spec, seed, session_script(run.level))
                    replays.append(replay)
                    notes += [f"{label}: {note}" for note in replay.notes]
                fig.best_hit_rate = _mean([replay.hit_rate for replay in replays])
                fig.sticky_ttft_p99_ms = ideal_ttft_p99_ms(
                    runs, replays, settings.replicas, settings.time_scale, sticky=True
                )
            fig.ideal_ttft_p99_ms = ideal_ttft_p99_ms(runs, replays, settings.replicas, settings.time_scale)
            rows[label][spec.name] = fig
            _progress(
                f"  hit {_fmt(fig.hit_rate, 100, '%')}, TTFT p50/p99 {_fmt(fig.ttft_p50_ms)}/{_fmt(fig.ttft_p99_ms)}"
                f" ms (ideal placement p99 {_fmt(fig.ideal_ttft_p99_ms)}), goodput {fig.goodput_rps:.1f}/s,"
                f" {fig.failed} failed, E2E stretch {_fmt(fig.e2e_stretch)}, {fig.wall_s:.0f} s"
            )
    return rows


def _fmt(value: float | None, scale: float = 1.0, unit: str = "") -> str:
    return "-" if value is None else f"{value * scale:.3g}{unit}"


# Saturation sweep -----------------------------------------------------------------------------------


def find_rate(settings: Settings, cluster: Cluster) -> dict[str, Any]:
    """Poisson sweep through the cache-aware reference router; saturation where the median TTFT climbs."""
    router = "sglang-router" if settings.router_python is not None else "spillgate"
    out: dict[str, Any] = {"router": f"{router} cache_aware", "workloads": {}}
    for spec in settings.specs:
        if spec.rate is None:
            continue
        points = []
        for rate in settings.sweep_rates.get(spec.name) or SWEEP_RATES.get(spec.name, (spec.rate,)):
            _progress(f"sweep {router} cache_aware: {spec.name} at {rate:g}/s")
            fig, _ = measure_row(settings, cluster, router, "cache_aware", spec.with_rate(rate))
            points.append((rate, fig))
        lightest = points[0][1].ttft_p50_ms or 0.0
        saturated = next(
            (rate for rate, fig in points if (fig.ttft_p50_ms or 0.0) >= SATURATION_TTFT_FACTOR * lightest),
            None,
        )
        out["workloads"][spec.name] = {
            "points": [{"rate": rate, **fig.to_json()} for rate, fig in points],
            "saturation_rate": saturated,
            "suggested_rate": None if saturated is None else round(BUSY_TARGET * saturated),
        }
    return out


def sweep_table(sweep: dict[str, Any]) -> str:
    lines = [f"Saturation sweep through {sweep['router']}:", ""]
    lines.append(
        "| workload | rate/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | goodput/s (SLO %) | hit | prefill busy % |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for name, data in sweep["workloads"].items():
        for p in data["points"]:
            busy = " ".join(f"{b:.0f}" for b in p["prefill_busy_pct"])
            lines.append(
                f"| {name} | {p['rate']:g} | {_fmt(p['ttft_p50_ms'])} / {_fmt(p['ttft_p99_ms'])} | "
                f"{_fmt(p['tpot_p50_ms'])} / {_fmt(p['tpot_p99_ms'])} | {p['goodput_rps']:.1f} "
                f"({_fmt(p['slo_pct'])}%) | {_fmt(p['hit_rate'], 100, '%')} | {busy} |"
            )
    lines.append("")
    for name, data in sweep["workloads"].items():
        lines.append(
            f"{name}: median TTFT >= {SATURATION_TTFT_FACTOR:g}x the lightest rate's from {data['saturation_rate']}/s;"
            f" {BUSY_TARGET:.0%} of that: {data['suggested_rate']}/s"
        )
    return "\n".join(lines)


# Report ---------------------------------------------------------------------------------------------


def targets(rows: Rows, best: dict[str, float | None], workloads: list[str]) -> list[str]:
    """The goals spillgate cache_aware must eventually meet, checked against this run's figures."""
    ours = rows.get("spillgate cache_aware", {})
    theirs = rows.get("sglang-router cache_aware", {})
    rr = rows.get("spillgate round_robin", {})
    lines = []
    for name in workloads:
        a, b, r = ours.get(name), theirs.get(name), rr.get(name)
        if a is None:
            continue
        top = a.best_hit_rate if a.best_hit_rate is not None else best.get(name)
        checks = []
        if b is not None and a.hit_rate is not None and b.hit_rate is not None:
            checks.append(_hit_check(a, b))
        if top and a.hit_rate is not None:
            ok = a.hit_rate >= 0.95 * top
            checks.append(f"hit within 5% of best {top:.1%} (>= {0.95 * top:.1%}): {'met' if ok else 'MISSED'}")
        if b is not None and a.ttft_p99_ms and b.ttft_p99_ms:
            checks.append(_ttft_check(a, b))
        if r is not None and r.goodput_rps > 0:
            ratio = a.goodput_rps / r.goodput_rps
            checks.append(f"goodput {ratio:.2f}x round_robin's (goal >= 1.5x): {'met' if ratio >= 1.5 else 'MISSED'}")
        lines.append(f"- {name}: " + "; ".join(checks))
    return lines


def _ttft_check(a: RunFigures, b: RunFigures) -> str:
    """Spillgate's TTFT p99 against the router's, and the goal against what the ideal placement reached."""
    assert a.ttft_p99_ms and b.ttft_p99_ms
    ratio = a.ttft_p99_ms / b.ttft_p99_ms
    check = f"TTFT p99 {ratio:.2f}x sglang-router's (goal <= 0.7x): {'met' if ratio <= 0.7 else 'MISSED'}"
    if a.ideal_ttft_p99_ms:
        goal = 0.7 * b.ttft_p99_ms
        check += (
            f" ({a.ttft_p99_ms:.0f} ms against a goal of {goal:.0f} ms; the ideal placement of the same requests:"
            f" {a.ideal_ttft_p99_ms:.0f} ms{', above the goal' if a.ideal_ttft_p99_ms > goal else ''}"
        )
        if a.sticky_ttft_p99_ms:
            above = ", above the goal" if a.sticky_ttft_p99_ms > goal else ""
            check += f", with each conversation's turns kept on one replica: {a.sticky_ttft_p99_ms:.0f} ms{above}"
        check += ")"
    return check


def _hit_check(a: RunFigures, b: RunFigures) -> str:
    """Spillgate's hit rate against the router's: raw when both sent the same requests, else the share of each
    run's own best achievable (chat: each router's timing decides which turns it sends). A run at or above its
    own best achievable is not below anyone's: nothing could have cached more of its turns."""
    assert a.hit_rate is not None and b.hit_rate is not None
    ours, theirs, what = a.hit_rate, b.hit_rate, ""
    if a.best_hit_rate and b.best_hit_rate:
        ours, theirs = a.hit_rate / a.best_hit_rate, b.hit_rate / b.best_hit_rate
        what = f" (of their own best: {ours:.1%} vs {theirs:.1%})"
    at_best = bool(what) and ours >= 1.0
    ok = ours >= theirs - HIT_RATE_TOLERANCE or at_best
    gap = ""
    if at_best and ours < theirs - HIT_RATE_TOLERANCE:
        gap = " (at its own best achievable, which the router's share passes only by the reference's own noise)"
    elif ok and ours < theirs:
        gap = f" ({(theirs - ours) * 100:.4f} points below: within noise)"
    return f"hit {a.hit_rate:.1%} vs sglang-router's {b.hit_rate:.1%}{what}: {'met' if ok else 'MISSED'}{gap}"


def render(
    settings: Settings,
    rows: Rows,
    best: dict[str, float | None],
    best_notes: list[str],
    header: dict[str, Any],
) -> str:
    names = [spec.name for spec in settings.specs]
    machine = header["machine"]
    loads = header["loads"]
    lines = [
        f"## Routers over {settings.replicas} simulated {PRESET} replicas",
        "",
        f"Command: `{header['command']}`" + (f" at {header['revision']}" if header["revision"] else ""),
        "",
        f"Machine: {machine['nproc']} cores ({machine['cpu_model']}), Python {machine['python']}; "
        f"load average before {loads['before']}, after {loads['after']}; runtime {header['runtime_s'] / 60:.1f} min.",
        "",
        f"Time scale {settings.time_scale:g}: the replicas run {settings.time_scale:g} wall s per simulated s. "
        "Every time and rate below is simulated (wall / time scale); SLO for goodput: "
        f"TTFT <= {SLO_TTFT_MS:g} ms and TPOT <= {SLO_TPOT_MS:g} ms, simulated.",
        (
            ""
            if settings.repeat == 1
            else f"Each row and workload: {settings.repeat} runs (seeds 0-{settings.repeat - 1}), "
            "pooled: percentiles over all their requests, rates over the sum of their arrival windows. "
        )
        + "Load: "
        + "; ".join(_load_line(spec, settings) for spec in settings.specs)
        + f". spillgate: prefill_tokens_per_s {SIM_PREFILL_TOKENS_PER_S:g} / time scale, health interval 0.5 s"
        + (
            f", {settings.gateways} gateway processes sharing state through Redis, requests sent to each in turn; "
            if settings.gateways > 1
            else "; "
        )
        + f"sglang-router {router_env.ROUTER_VERSION} with its defaults but the policy ({settings.router_note}).",
        "",
        main_table(rows, names, best),
        "",
        "hit: prompt tokens the replicas found cached / prompt tokens (their own counters). spread: the busiest "
        "replica's request share / the idlest's. goodput: requests meeting both SLOs per simulated second of "
        "arrivals (offered rate x SLO attainment). "
        "best achievable: the same requests, one at a time, to one replica whose KV pool holds them all; for chat, "
        "whose turns depend on timing, each row's own turns in its order ('of' in its hit cell), and spillgate's "
        "hit rate is held against the router's as a share of each one's own best.",
    ]
    lines += [f"Note: {note}" for note in best_notes]
    checks = targets(rows, best, names)
    if checks:
        lines += ["", "Targets for spillgate cache_aware:", *checks]
    lines += [
        "",
        "Details (est. prefill busy: the simulator's prefill roofline over each replica's uncached tokens, "
        "per simulated second of the run; ideal placement TTFT p99: the row's own requests at the times it sent "
        "them, each finding the best achievable cache, prefilled one per pass on whichever replica frees first at "
        "the roofline's compute time, no decode or pass overhead: a floor no router can beat; "
        "same, turns kept home (chat): each conversation's later turns on the replica its first turn went to, "
        "where they find their history cached; first turns as above (greedy, so a reference rather than a strict "
        "floor); "
        "E2E stretch: client E2E / the replicas' own simulated E2E, 1.0 when the "
        "replicas kept simulated time; TTFT overhead: client mean TTFT minus the replicas' mean, simulated ms, "
        "i.e. tokenizing, relaying and streaming on this machine's CPUs):",
        "",
        details_table(rows, names),
    ]
    return "\n".join(lines)


def _load_line(spec: WorkloadSpec, settings: Settings) -> str:
    if spec.rate is None:
        line = f"{spec.name} replayed at {spec.trace_speedup:g}x its clock ({spec.trace_requests} records)"
    else:
        knobs = spec.gsp if spec.workload == "gsp" else spec.chat
        line = f"{spec.name} at {spec.rate:g} req/s Poisson, {spec.num_requests(settings.sent_s())} requests ({knobs})"
        if spec.workload == "chat":
            line += f", ready sessions sent in {settings.session_order} order"
    if settings.warmup_s:
        line += f", those sent in the first {settings.warmup_s:g} s not counted in latencies and goodput"
    return line


# Entry point ----------------------------------------------------------------------------------------


def build_settings(args: argparse.Namespace, work_dir: Path) -> Settings:
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    specs = [workload_spec(n, trace_speedup=args.trace_speedup, trace_requests=args.trace_requests) for n in names]
    rates = parse_rates(args.rate, [spec.name for spec in specs if spec.rate is not None])
    if not args.find_rate and any(len(values) > 1 for values in rates.values()):
        raise ValueError("several rates per workload (a/b/c) are for --find-rate only")
    specs = [spec.with_rate(rates[spec.name][0]) if spec.name in rates else spec for spec in specs]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(SPILLGATE_POLICIES))
    if unknown:
        raise ValueError(f"unknown spillgate policies {unknown}; choose from {', '.join(SPILLGATE_POLICIES)}")
    router_policies = [p.strip() for p in args.router_policies.split(",") if p.strip()]
    unknown = sorted(set(router_policies) - set(ROUTER_POLICIES))
    if unknown:
        raise ValueError(f"unknown sglang-router policies {unknown}; choose from {', '.join(ROUTER_POLICIES)}")
    python, note = (None, "--skip-router") if args.skip_router else router_env.router_python()
    if python is None and not args.skip_router:
        _progress(f"sglang-router rows skipped: {note}")
    return Settings(
        sweep_rates=rates,
        replicas=args.replicas,
        time_scale=args.time_scale,
        duration_s=args.duration,
        warmup_s=args.warmup,
        session_order=args.session_order,
        repeat=args.repeat,
        specs=specs,
        spillgate_policies=policies,
        router_policies=router_policies,
        router_python=python,
        router_note=note,
        work_dir=work_dir,
        trace_dir=Path(args.trace_dir) if args.trace_dir else None,
        route=_route_settings(args.route),
        gateways=args.gateways,
    )


def _route_settings(text: str | None) -> dict[str, Any]:
    """``--route``: a YAML mapping merged into spillgate's route (the gateway validates what it holds)."""
    if not text:
        return {}
    try:
        settings = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"--route is not YAML: {exc}") from exc
    if not isinstance(settings, dict):
        raise ValueError(f"--route must be a mapping, such as '{{affinity: {{max_slowdown: 4}}}}', got {text!r}")
    return settings


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    command = shlex.join([_python_path(), "-m", "tests.bench.compare_routers", *sys.argv[1:]])
    machine = report.machine_info()
    load_before = report.load_average()
    work_dir = Path(tempfile.mkdtemp(prefix="spillgate-compare-"))
    settings = build_settings(args, work_dir)
    cluster = Cluster(settings.time_scale, work_dir)
    reference = Reference(work_dir)
    ok = False
    shared = contextlib.ExitStack()
    try:
        if settings.gateways > 1:
            settings.redis_url = shared.enter_context(private_redis(work_dir))
        _progress(f"starting {settings.replicas} replicas at time scale {settings.time_scale:g} (logs in {work_dir})")
        cluster.start(settings.replicas, bare=args.bare)
        if args.find_rate:
            sweep = find_rate(settings, cluster)
            print(sweep_table(sweep))
            if args.json:
                Path(args.json).write_text(json.dumps({"command": command, "machine": machine, **sweep}, indent=2))
            ok = True
            shutil.rmtree(work_dir, ignore_errors=True)
            return 0
        reference.start()
        fixed = fixed_replays(settings, reference)
        best = {name: _mean([replay.hit_rate for replay in replays]) for name, replays in fixed.items()}
        best_notes = [note for replays in fixed.values() for replay in replays for note in replay.notes]
        rows = compare(settings, cluster, reference, fixed, best_notes)
        ok = True
    finally:
        reference.stop()
        cluster.stop()
        shared.close()
        if not ok:
            print(f"logs kept in {work_dir}", file=sys.stderr)
    header = {
        "command": command,
        "revision": _revision(),
        "machine": machine,
        "loads": {"before": load_before, "after": report.load_average()},
        "runtime_s": time.monotonic() - started,
    }
    print(render(settings, rows, best, best_notes, header))
    if args.json:
        document = {
            "version": 1,
            **header,
            "settings": {
                "replicas": settings.replicas,
                "preset": PRESET,
                "time_scale": settings.time_scale,
                "duration_s": settings.duration_s,
                "warmup_s": settings.warmup_s,
                "session_order": settings.session_order,
                "repeat": settings.repeat,
                "slo_ttft_ms": SLO_TTFT_MS,
                "slo_tpot_ms": SLO_TPOT_MS,
                "workloads": {spec.name: _spec_json(spec, settings.sent_s()) for spec in settings.specs},
                "router": settings.router_note,
            },
            "best_hit_rate": best,
            "best_notes": best_notes,
            "rows": {label: {n: f.to_json() if f else None for n, f in by.items()} for label, by in rows.items()},
        }
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    shutil.rmtree(work_dir, ignore_errors=True)
    return 0


def _python_path() -> str:
    """The interpreter as the user would type it: relative to the repo when it is the repo's venv."""
    python = Path(sys.executable)
    try:
        return str(python.relative_to(REPO_ROOT))
    except ValueError:
        return str(python)


def _revision() -> str:
    """The commit measured, marked when the working tree has changes on top of it; empty outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True)
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def _spec_json(spec: WorkloadSpec, duration_s: float) -> dict[str, Any]:
    return {
        "workload": spec.workload,
        "rate": spec.rate,
        "num_requests": spec.num_requests(duration_s),
        "knobs": str(spec.gsp if spec.workload == "gsp" else spec.chat),
        "trace_speedup": spec.trace_speedup,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4, help="simulated replicas (default 4)")
    parser.add_argument(
        "--time-scale", type=float, default=6.0, help="wall seconds per simulated second (default 6: slower than real)"
    )
    parser.add_argument(
        "--workloads",
        default="gsp,gsp-zipf,chat",
        help="comma list of gsp, gsp-zipf, chat, trace:PATH (default gsp,gsp-zipf,chat)",
    )
    parser.add_argument(
        "--rate", default=None, help="simulated req/s: one for all, or gsp=110,chat=70 (default: measured rates)"
    )
    parser.add_argument(
        "--duration", type=float, default=4.0, help="simulated seconds of arrivals per run: rate x duration requests"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="simulated seconds of arrivals before --duration, sent but not counted in latencies and goodput",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per row and workload (seeds 0..N-1), pooled into one figure: steadier percentiles",
    )
    parser.add_argument(
        "--session-order",
        choices=SESSION_ORDERS,
        default="random",
        help="chat: which ready session sends its next turn (default random, as SGLang's multi-turn benchmark)",
    )
    parser.add_argument("--policies", default=",".join(SPILLGATE_POLICIES), help="spillgate policies to run")
    parser.add_argument(
        "--trace-speedup", type=float, default=2.0, help="trace:PATH replayed this many times faster (untuned)"
    )
    parser.add_argument("--trace-requests", type=int, default=300, help="trace:PATH: its first N records")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON to FILE")
    parser.add_argument("--router-policies", default=",".join(ROUTER_POLICIES), help="sglang-router policies to run")
    parser.add_argument("--skip-router", action="store_true", help="leave out the sglang-router rows")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="replicas on SGLang's bare defaults (no --enable-metrics, no --enable-cache-report)",
    )
    parser.add_argument(
        "--trace-dir",
        metavar="DIR",
        help="keep per-request data in DIR: the client's view of every run, spillgate's decisions (trace_gateway)",
    )
    parser.add_argument(
        "--route",
        metavar="YAML",
        help="more settings for spillgate's route, e.g. '{affinity: {max_slowdown: 4}, weights: {prefix_hit: 0.05}}'",
    )
    parser.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="spillgate as N processes sharing state through Redis (REDIS_URL, else a private redis-server), "
        "requests sent to each in turn (default 1)",
    )
    parser.add_argument(
        "--find-rate", action="store_true", help="sweep rates through the cache-aware reference and suggest one"
    )
    args = parser.parse_args(argv)
    if args.replicas < 1 or args.time_scale <= 0 or args.duration <= 0:
        parser.error("--replicas, --time-scale and --duration must be positive")
    if args.warmup < 0:
        parser.error("--warmup must be zero or positive")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.gateways < 1:
        parser.error("--gateways must be at least 1")
    return run_script("compare_routers", run, args)


if __name__ == "__main__":
    sys.exit(main())
