"""The KV-events benchmark's own arithmetic: rows, counts from /health, verdicts, the trace slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from spillgate.gateway.bench.api import LevelResult
from spillgate.gateway.bench.stats import Slo, summarize
from tests.bench.compare_cluster import ReplicaCounters, gateway_config
from tests.bench.compare_kv_events import (
    BELIEF_POOL,
    PREFIX,
    Row,
    RowResult,
    WorkloadResult,
    add_probes,
    hit_over,
    parse_counts,
    plan_rows,
    trace_slice,
    verdicts,
)
from tests.bench.compare_routers import Run
from tests.bench.compare_table import RunFigures
from tests.bench.compare_workloads import workload_spec


def _figures(hit: float, ttft_p99: float, tpot_p50: float) -> RunFigures:
    return RunFigures(
        completed=100, failed=0, unfinished=0, hit_rate=hit, client_hit_rate=hit, ttft_p50_ms=10.0,
        ttft_p99_ms=ttft_p99, tpot_p50_ms=tpot_p50, tpot_p99_ms=20.0, goodput_rps=10.0, slo_pct=100.0,
        throughput_rps=10.0, offered_rps=10.0, shares_pct=[50.0, 50.0], spread=1.0, prefill_busy_pct=[50.0],
        window_prefill_busy_pct=50.0, warmup_requests=0, e2e_stretch=1.0, ttft_overhead_ms=1.0, sim_duration_s=4.0,
        wall_s=24.0, errors={},
    )  # fmt: skip


def _run(prompt: float, cached: float) -> Run:
    slo = Slo(ttft_ms=1000.0, tpot_ms=50.0)
    level = LevelResult(
        label="r", concurrency=None, rate=1.0, summary=summarize([], duration_s=1.0, unfinished=0, slo=slo), results=[]
    )
    return Run(level, [ReplicaCounters(prompt_tokens=prompt, cached_tokens=cached)], 1.0, (1.0, 0.0), slo)


def test_rows_and_counts() -> None:
    rows = plan_rows(["events", "belief", "sglang-router", "smg"], [1, 2])
    assert [row.label for row in rows] == [
        "spillgate cache_aware, events",
        "spillgate cache_aware, belief",
        "spillgate cache_aware, events, 2 processes",
        "spillgate cache_aware, belief, 2 processes",
        "sglang-router 0.3.2 cache_aware",
        "smg 1.13.0 cache_aware",
    ]
    assert parse_counts("gsp=2, trace=3") == {"gsp": 2, "trace": 3}
    with pytest.raises(ValueError, match="NAME=N"):
        parse_counts("gsp=0")


def test_the_belief_row_differs_from_the_events_row_only_in_its_source() -> None:
    events = gateway_config(["http://127.0.0.1:1"], "cache_aware", 8080, 6.0, prefix=PREFIX)
    belief = gateway_config(["http://127.0.0.1:1"], "cache_aware", 8080, 6.0, pool=BELIEF_POOL, prefix=PREFIX)
    assert events["prefix"] == belief["prefix"] == {"tokenizer": "simulated"}
    assert belief["pools"][0].pop("kv_events") == {"enabled": False}
    assert belief == events


def test_predictions_add_up_over_processes_and_runs() -> None:
    result = RowResult(_figures(0.5, 100.0, 10.0))
    probe = {"predictions": {"events": {"exact": 8, "over": 1}}, "sources": {"events": 4}, "gaps": 1}
    add_probes(result, [probe, None, {"predictions": {"events": {"exact": 2, "under": 1}}, "sources": {}, "gaps": 0}])
    assert result.predictions == {"events": {"exact": 10, "over": 1, "under": 1}}
    assert result.sources == {"events": 4} and result.gaps == 1
    assert result.exact_share() == pytest.approx(10 / 12)
    assert RowResult(_figures(0.5, 100.0, 10.0)).exact_share() is None
    add_probes(result, [{"predictions": {"belief_unused": {"exact": 1, "over": 3}}, "sources": {}, "gaps": 0}])
    assert result.exact_share() == pytest.approx(10 / 12), "what the belief would have done is counted apart"
    assert result.exact_share(shadow=True) == pytest.approx(0.25)
    assert (result.predicted(), result.predicted(shadow=True)) == (12, 4)


def test_verdicts() -> None:
    spec = workload_spec("gsp", trace_speedup=1.0, trace_requests=1)
    result = WorkloadResult(spec, 2, 1000.0, 125, None)
    one = [_run(1000, 600), _run(1000, 400)]
    result.rows = {
        Row("events").label: RowResult(_figures(0.5, 160.0, 10.0), one),
        Row("belief").label: RowResult(_figures(0.47, 300.0, 10.0)),
        Row("events", 2).label: RowResult(_figures(0.59, 170.0, 10.0), one[:1]),
        Row("sglang-router").label: RowResult(_figures(0.45, 200.0, 9.96)),
        Row("smg").label: RowResult(_figures(0.50004, 210.0, 11.0)),
    }
    assert hit_over(one) == pytest.approx(0.5)
    lines = verdicts(result)
    assert lines[0] == "hit 50.0% = 1.064x belief's 47.0% (goal >= 1.05x): met"
    assert lines[1] == "hit vs best peer's 50.0%: met", "a hundredth of a point below is noise"
    assert lines[2] == "TTFT p99 160 ms = 0.80x best peer's 200 (goal <= 0.8x): met"
    assert lines[3] == "TPOT p50 10.0 ms vs best peer's 10.0: met"
    assert lines[4] == "2 processes: hit 59.0%, -1.0 points vs one's 60.0% over seeds 0-0 (goal within 1): met"


def test_trace_slice(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i}}}\n' for i in range(10)))
    name = trace_slice(f"trace:{trace}", -3, 2, tmp_path)
    assert Path(name.removeprefix("trace:")).read_text() == '{"timestamp": 7}\n{"timestamp": 8}\n'
