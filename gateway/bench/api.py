"""The Python entry point: ``await run_bench(config)`` runs every level of a config and returns the figures.

Comparison scripts call this directly; the CLI is a thin layer over it.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass, field

import httpx

from spillgate.gateway.bench import arrivals, text
from spillgate.gateway.bench.client import ChatClient, RequestResult, api_paths
from spillgate.gateway.bench.config import BenchConfig
from spillgate.gateway.bench.progress import Progress
from spillgate.gateway.bench.runner import Load, run_level
from spillgate.gateway.bench.stats import PhaseSummary, Slo, Summary, summarize, summarize_phases
from spillgate.gateway.bench.trace import TraceRecord, arrival_offsets, load_trace, scaled
from spillgate.gateway.bench.workloads import build_workload

_DRAIN_MARGIN_S = 5.0


class BenchError(Exception):
    """The run could not start (bad config, unreadable trace, no model to send to)."""


@dataclass
class LevelResult:
    """One row of the report: a concurrency level, the open-loop rate, the rate schedule or the trace replay.

    A rate schedule's level also has one summary per phase (``phases``), over the requests each phase sent.
    """

    label: str
    concurrency: int | None
    rate: float | None
    summary: Summary
    results: list[RequestResult] = field(repr=False)
    """Every finished request, warm-up included."""
    phases: list[PhaseSummary] = field(default_factory=list)
    warmup_s: float = 0.0

    @property
    def measured(self) -> list[RequestResult]:
        """The requests ``summary`` counts: those sent after the warm-up."""
        return [result for result in self.results if after_warmup(result, self.warmup_s)]

    @property
    def warmup_requests(self) -> int:
        """Finished requests sent within ``warmup_s`` of the level's start: in ``results``, not in ``summary``."""
        return len(self.results) - len(self.measured)


def after_warmup(result: RequestResult, warmup_s: float) -> bool:
    """Whether a request was sent after the warm-up (by its scheduled arrival in open loop)."""
    sent = result.scheduled if result.scheduled is not None else result.start
    return sent >= warmup_s


@dataclass
class BenchResult:
    config: BenchConfig
    model: str
    started_at: str
    levels: list[LevelResult]
    interrupted: bool


async def run_bench(
    config: BenchConfig, *, stop: asyncio.Event | None = None, progress: Progress | None = None
) -> BenchResult:
    """Run ``config``: one level, or one per concurrency of a sweep. Setting ``stop`` ends it early with the
    figures so far (``interrupted`` is then true and later sweep levels are skipped)."""
    try:
        config.validate()
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    stop = stop or asyncio.Event()
    records: list[TraceRecord] | None = None
    if config.trace_path is not None:
        try:
            records = scaled(load_trace(config.trace_path), config.trace_block_tokens, config.trace_max_output_tokens)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
    model = config.model or await discover_model(config)
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    client = ChatClient(
        config.urls,
        model=model,
        api_key=config.api_key,
        request_timeout=config.request_timeout_s,
        connect_timeout=config.connect_timeout_s,
    )
    slo = Slo(ttft_ms=config.slo_ttft_ms, tpot_ms=config.slo_tpot_ms)
    levels: list[LevelResult] = []
    try:
        for index, concurrency in enumerate(config.levels()):
            if stop.is_set():
                break
            levels.append(await _run_one(config, index, concurrency, records, client, stop, slo, progress))
    finally:
        client.close()
    return BenchResult(config=config, model=model, started_at=started_at, levels=levels, interrupted=stop.is_set())


async def _run_one(
    config: BenchConfig,
    index: int,
    concurrency: int | None,
    records: list[TraceRecord] | None,
    client: ChatClient,
    stop: asyncio.Event,
    slo: Slo,
    progress: Progress | None,
) -> LevelResult:
    # A fresh salt per level: a sweep's later levels must not find the earlier levels' prompts cached.
    salt = f"{config.seed}:{index}"
    rate_schedule = config.schedule() if config.rate_schedule is not None else None
    # A schedule is its own limit: the workload repeats (new questions, same system prompts) until it ends.
    limited = config.num_requests is not None or config.duration_s is not None or rate_schedule is not None
    workload = build_workload(config, salt, cycle=limited, records=records, min_sessions=concurrency or 0)
    if concurrency is not None:
        label, schedule = f"c={concurrency}", None
    elif config.rate is not None:
        rng = text.rng_for(salt, "arrivals")
        label, schedule = f"rate={config.rate:g}/s", arrivals.poisson_offsets(config.rate, rng)
    elif rate_schedule is not None:
        rng = text.rng_for(salt, "arrivals")
        label, schedule = "schedule", rate_schedule.offsets(rng)
    else:
        label, schedule = f"trace x{config.trace_speedup:g}", arrival_offsets(records or [], config.trace_speedup)
    load = Load(
        concurrency=concurrency,
        arrivals=schedule,
        num_requests=config.num_requests,
        duration_s=config.duration_s,
        drain_s=config.request_timeout_s + _DRAIN_MARGIN_S,
    )
    on_tick = None
    if progress is not None:
        total = config.num_requests if limited else workload.natural_size
        if records is not None and total is not None:
            total = min(total, len(records))  # a trace is never repeated
        duration_s = config.duration_s
        if rate_schedule is not None:
            duration_s = min(duration_s or rate_schedule.duration_s, rate_schedule.duration_s)
        progress.start(label, total=total, duration_s=duration_s)
        on_tick = progress.tick
    try:
        run = await run_level(client, workload, load, stop, on_tick)
    finally:
        if progress is not None:
            progress.finish()
    measured = [result for result in run.results if after_warmup(result, config.warmup_s)]
    summary = summarize(
        measured, duration_s=max(run.duration_s - config.warmup_s, 0.0), unfinished=run.unfinished, slo=slo
    )
    phases = []
    if rate_schedule is not None:
        ran_s = rate_schedule.duration_s
        if config.duration_s is not None:
            ran_s = min(ran_s, config.duration_s)
        if run.interrupted:
            ran_s = min(ran_s, run.duration_s)
        phases = summarize_phases(run.results, rate_schedule, slo=slo, ran_s=ran_s)
    return LevelResult(
        label=label,
        concurrency=concurrency,
        rate=config.rate,
        summary=summary,
        results=run.results,
        phases=phases,
        warmup_s=config.warmup_s,
    )


async def discover_model(config: BenchConfig) -> str:
    """The first model ``GET /v1/models`` lists, for runs that did not name one."""
    base, _ = api_paths(config.url)
    headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=config.connect_timeout_s) as http:
            response = await http.get(base + "/v1/models", headers=headers)
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise BenchError(f"cannot list models at {base}/v1/models ({exc}); pass --model") from exc
