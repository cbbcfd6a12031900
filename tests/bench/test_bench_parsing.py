"""The benchmark's pure parts, checked without starting anything: a misread wrk report would go unnoticed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spillgate.backends.sim import timing
from spillgate.backends.sim.presets import Preset, get_preset
from spillgate.gateway.bench.api import LevelResult
from spillgate.gateway.bench.client import RequestResult
from spillgate.gateway.bench.stats import Slo, summarize
from tests.bench.compare_cluster import PRESET, ReplicaCounters, gateway_config
from tests.bench.compare_routers import Replay, Run, _route_settings, by_session, ideal_ttft_p99_ms, targets
from tests.bench.compare_table import RunFigures, figures
from tests.bench.ideal_placement import IdealRequest, ideal_ttfts, replayed_ttfts, sticky_ttfts
from tests.bench.loadgen import percentile_ms
from tests.bench.miss_breakdown import breakdown, miss_class, row_of
from tests.bench.report import GOALS, goals_met
from tests.bench.workload import Workload
from tests.bench.wrk import parse_wrk

WRK_OUTPUT = """Running 1s test @ http://127.0.0.1:19501/v1/chat/completions
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   247.21us   52.57us 736.00us   80.46%
    Req/Sec    31.74k   610.63    32.45k    80.00%
  Latency Distribution
     50%  251.00us
     75%  271.00us
     90%  285.00us
     99%    1.37ms
  31578 requests in 1.00s, 12.32MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  31559.35
Transfer/sec:     12.31MB
"""


def test_parse_wrk_reads_rate_percentiles_and_errors() -> None:
    result = parse_wrk(WRK_OUTPUT, connections=8, seconds=1)
    assert result.requests == 31578
    assert result.per_second == 31559.35
    assert result.p50_ms == 0.251
    assert result.p99_ms == 1.37
    assert result.non_2xx == 4
    assert result.socket_errors == 3


def test_percentile_is_nearest_rank_in_ms() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentile_ms(samples, 0.50) == 50.0
    assert percentile_ms(samples, 0.99) == 99.0
    assert math.isnan(percentile_ms([], 0.5))


def test_workload_request_and_wrk_script_carry_the_same_body_and_key() -> None:
    workload = Workload(port=8080, model="chat", api_key="sk-x")
    raw = workload.raw_request(stream=True)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert body == workload.body(stream=True)
    assert b"content-length: %d" % len(body) in head
    assert b"authorization: Bearer sk-x" in head
    script = workload.wrk_script(stream=True)
    assert body.decode() in script
    assert 'wrk.headers["authorization"] = "Bearer sk-x"' in script


def test_goals_are_judged_on_added_latency_and_rates() -> None:
    row = {
        "added": {"p50_ms": 0.4, "ttfb_p99_ms": 2.5},
        "nonstream": {"per_second": 3000.0},
        "stream": {"per_second": 1400.0},
    }
    met = goals_met(row)
    assert list(met) == [goal.label for goal in GOALS]
    assert list(met.values()) == [True, True, False, False]


def _figures(hit_rate: float, ttft_p99_ms: float, goodput_rps: float, best: float | None = None) -> RunFigures:
    return RunFigures(
        completed=100, failed=0, unfinished=0, hit_rate=hit_rate, client_hit_rate=hit_rate,
        ttft_p50_ms=10.0, ttft_p99_ms=ttft_p99_ms, tpot_p50_ms=10.0, tpot_p99_ms=20.0, goodput_rps=goodput_rps,
        slo_pct=100.0, throughput_rps=10.0, offered_rps=10.0, shares_pct=[50.0, 50.0], spread=1.0,
        prefill_busy_pct=[50.0, 50.0], window_prefill_busy_pct=50.0, warmup_requests=0, e2e_stretch=1.0,
        ttft_overhead_ms=1.0, sim_duration_s=4.0, wall_s=24.0, errors={}, best_hit_rate=best,
    )  # fmt: skip


def test_router_comparison_verdicts() -> None:
    """A cached token's difference is noise; a real shortfall, a slow tail or thin goodput is a miss."""
    rows = {
        "sglang-router cache_aware": {"chat": _figures(0.402719, 262.0, 75.0)},
        "spillgate round_robin": {"chat": _figures(0.162, 482.0, 40.0)},
    }
    close = {**rows, "spillgate cache_aware": {"chat": _figures(0.402717, 180.0, 75.0)}}
    (line,) = targets(close, {"chat": 0.403}, ["chat"])
    assert "sglang-router's 40.3%: met (0.0002 points below: within noise)" in line
    assert "TTFT p99 0.69x sglang-router's (goal <= 0.7x): met" in line
    assert "goodput 1.88x round_robin's (goal >= 1.5x): met" in line
    below = {**rows, "spillgate cache_aware": {"chat": _figures(0.400, 264.0, 50.0)}}
    (line,) = targets(below, {"chat": 0.403}, ["chat"])
    assert "sglang-router's 40.3%: MISSED" in line
    assert "TTFT p99 1.01x sglang-router's (goal <= 0.7x): MISSED" in line
    assert "goodput 1.25x round_robin's (goal >= 1.5x): MISSED" in line


def test_chat_hit_rates_are_judged_against_each_runs_own_best() -> None:
    """Each router's timing decides which chat turns it sends: compare the share of each run's own best."""
    router = {"sglang-router cache_aware": {"chat": _figures(0.454, 209.0, 75.0, best=0.458)}}
    fewer_late_turns = {**router, "spillgate cache_aware": {"chat": _figures(0.436, 140.0, 75.0, best=0.439)}}
    (line,) = targets(fewer_late_turns, {}, ["chat"])
    assert "hit 43.6% vs sglang-router's 45.4% (of their own best: 99.3% vs 99.1%): met" in line
    assert "hit within 5% of best 43.9% (>= 41.7%): met" in line
    lost_hits = {**router, "spillgate cache_aware": {"chat": _figures(0.430, 140.0, 75.0, best=0.458)}}
    (line,) = targets(lost_hits, {}, ["chat"])
    assert "(of their own best: 93.9% vs 99.1%): MISSED" in line
    both_at_best = {
        "sglang-router cache_aware": {"chat": _figures(0.472232, 194.0, 75.0, best=0.472013)},
        "spillgate cache_aware": {"chat": _figures(0.470949, 166.0, 75.0, best=0.470812)},
    }
    (line,) = targets(both_at_best, {}, ["chat"])
    assert "(of their own best: 100.0% vs 100.0%): met (at its own best achievable" in line


def test_repeats_pool_into_one_row() -> None:
    """Two runs of a row: percentiles over both runs' requests, goodput over the sum of their windows."""
    slo = Slo(ttft_ms=1000.0, tpot_ms=50.0)

    def level(ttfts: list[float]) -> LevelResult:
        results = [
            RequestResult(start=float(i), ok=True, ttft=t, tpot=0.01, e2e=t + 1.0, prompt_tokens=100, cached_tokens=50)
            for i, t in enumerate(ttfts)
        ]
        summary = summarize(results, duration_s=len(ttfts) + 1.0, unfinished=0, slo=slo)
        return LevelResult(label="r", concurrency=None, rate=1.0, summary=summary, results=results)

    fast, slow = level([0.1] * 10), level([0.1] * 9 + [3.0])
    counters = [ReplicaCounters(requests=20, prompt_tokens=2000, cached_tokens=1000, e2e_sum_s=25.0, e2e_count=20)]
    fig = figures([fast, slow], counters, slo=slo, time_scale=1.0, wall_s=20.0)
    assert fig.runs == 2 and fig.completed == 20
    assert fig.ttft_p50_ms == pytest.approx(100.0)
    assert fig.ttft_p99_ms is not None and 100.0 < fig.ttft_p99_ms < 3000.0, "one slow request in twenty"
    assert fig.goodput_rps == pytest.approx(19 / 18), "19 met the SLO over two windows of 9 s"
    assert fig.hit_rate == pytest.approx(0.5)
    alone = figures([slow], counters, slo=slo, time_scale=1.0, wall_s=10.0)
    assert alone.ttft_p99_ms is not None and alone.ttft_p99_ms > fig.ttft_p99_ms


def test_chat_reference_replays_one_session_at_a_time() -> None:
    assert by_session((3, 1, 3, 2, 1, 3)) == (3, 3, 3, 1, 1, 2)
    assert by_session(()) == ()


def test_ideal_placement_queues_on_the_first_free_replica() -> None:
    """Two replicas, three cold prompts at once: the third waits for the first; a cached prefix costs less."""
    preset = get_preset(PRESET)
    cold = timing.prefill_compute_seconds(preset, 2000, 0)
    warm = timing.prefill_compute_seconds(preset, 100, 1900)
    requests = [IdealRequest(0.0, 2000, 0), IdealRequest(0.0, 2000, 0), IdealRequest(0.0, 2000, 0)]
    assert ideal_ttfts(requests, 2, preset) == pytest.approx([cold, cold, 2 * cold])
    later = [IdealRequest(10.0, 2000, 1900), IdealRequest(0.0, 2000, 0)]
    assert ideal_ttfts(later, 1, preset) == pytest.approx([warm, cold]), "results keep the order given"
    assert warm < cold / 5


def test_ideal_placement_maps_a_chat_replay_back_to_the_run() -> None:
    """The reference replays chat turns session by session: each turn's best cache goes back to that turn."""
    preset = get_preset(PRESET)
    slo = Slo(ttft_ms=1000.0, tpot_ms=50.0)
    sent = [(0.0, 7, 1000), (1.0, 9, 1000), (2.0, 7, 2000)]  # (start, session, prompt tokens)
    results = [RequestResult(start=t, ok=True, ttft=0.1, e2e=0.5, prompt_tokens=p, session=s) for t, s, p in sent]
    level = LevelResult(
        label="r", concurrency=None, rate=1.0, summary=summarize(results, duration_s=3.0, unfinished=0, slo=slo),
        results=results, warmup_s=0.5,
    )  # fmt: skip
    run = Run(level, [], 30.0, (1.0, 0.0), slo)
    # Replayed as conversation 7's two turns, then conversation 9's: the second turn of 7 found 1,000 tokens cached.
    replay = Replay(hit_rate=0.25, requests=[(1000, 0), (2000, 1000), (1000, 0)], notes=[])
    expected = ideal_ttfts(
        [IdealRequest(0.0, 1000, 0), IdealRequest(1.0, 1000, 0), IdealRequest(2.0, 2000, 1000)], 1, preset
    )
    measured = expected[1:]  # the first was sent within the warm-up
    p99 = ideal_ttft_p99_ms(runs=[run], replays=[replay], replicas=1, time_scale=1.0)
    assert p99 == pytest.approx(1000.0 * (measured[0] + 0.99 * (measured[1] - measured[0])))
    assert ideal_ttft_p99_ms([run], [Replay(0.25, replay.requests[:2], [])], 1, 1.0) is None, "a request missing"


def test_ttft_verdict_names_the_ideal_placement() -> None:
    rows = {"sglang-router cache_aware": {"gsp": _figures(0.79, 337.0, 118.0)}}
    ours = _figures(0.80, 280.0, 118.0)
    ours.ideal_ttft_p99_ms = 250.0
    (line,) = targets({**rows, "spillgate cache_aware": {"gsp": ours}}, {"gsp": 0.804}, ["gsp"])
    assert "TTFT p99 0.83x sglang-router's (goal <= 0.7x): MISSED" in line
    assert "(280 ms against a goal of 236 ms; the ideal placement of the same requests: 250 ms, above the goal)" in line
    ours.ideal_ttft_p99_ms, ours.sticky_ttft_p99_ms = 120.0, 245.0
    (line,) = targets({**rows, "spillgate cache_aware": {"gsp": ours}}, {"gsp": 0.804}, ["gsp"])
    sticky = "with each conversation's turns kept on one replica: 245 ms, above the goal)"
    assert f"the same requests: 120 ms, {sticky}" in line


def _cold_prompt_and_turn() -> tuple[Preset, float, float]:
    """The preset, and its prefill seconds for a cold 2k-token prompt and for a turn with 1k of 2k cached."""
    preset = get_preset(PRESET)
    return preset, timing.prefill_compute_seconds(preset, 2000, 0), timing.prefill_compute_seconds(preset, 1000, 1000)


def test_sticky_placement_keeps_a_conversation_on_its_first_replica() -> None:
    """Two replicas: conversation 1's second turn waits behind its replica although the other one is free."""
    preset, cold, turn = _cold_prompt_and_turn()
    requests = [
        IdealRequest(0.0, 2000, 0, session=1),
        IdealRequest(0.0, 2000, 0, session=2),
        IdealRequest(0.0, 2000, 0, session=3),  # queues behind conversation 1 on replica 0
        IdealRequest(cold / 2, 2000, 1000, session=1),  # replica 1 frees at `cold`, replica 0 at 2 x cold
    ]
    assert sticky_ttfts(requests, 2, preset) == pytest.approx([cold, cold, 2 * cold, 2 * cold + turn - cold / 2])
    moved = ideal_ttfts(requests, 2, preset)
    assert moved[3] == pytest.approx(cold + turn - cold / 2), "without the rule the turn takes the first free"
    independent = [IdealRequest(r.arrival_s, r.prompt_tokens, r.cached_tokens) for r in requests]
    assert sticky_ttfts(independent, 2, preset) == pytest.approx(moved), "no sessions: the ideal placement"


def test_replayed_placement_keeps_the_runs_own_choice_of_replica() -> None:
    """A run that put two new conversations on one replica: the second queues there, although the other is
    free, and its later turn follows it; the reference would have used the free replica."""
    preset, cold, turn = _cold_prompt_and_turn()
    requests = [
        IdealRequest(0.0, 2000, 0, session=1),
        IdealRequest(0.0, 2000, 0, session=2),
        IdealRequest(3 * cold, 2000, 1000, session=2),
    ]
    chosen = [0, 0, 1]  # the third is a later turn: it goes home to replica 0 whatever the run's row says
    assert replayed_ttfts(requests, 2, preset, chosen) == pytest.approx([cold, 2 * cold, turn])
    assert sticky_ttfts(requests, 2, preset) == pytest.approx([cold, cold, turn])
    crowded = [IdealRequest(0.0, 2000, 0, session=1), IdealRequest(cold / 2, 2000, 1000, session=1)]
    assert replayed_ttfts(crowded, 2, preset, [1, 0]) == pytest.approx([cold, cold / 2 + turn])


def test_route_settings_from_the_command_line_reach_spillgates_route() -> None:
    route = _route_settings("{affinity: {max_slowdown: 2}, weights: {prefix_hit: 0.05}}")
    config = gateway_config(["http://127.0.0.1:1"], "cache_aware", 8080, 6.0, route)
    (only,) = config["routes"]
    assert only["policy"] == "cache_aware" and only["affinity"] == {"max_slowdown": 2}
    assert only["weights"] == {"prefix_hit": 0.05}
    assert _route_settings(None) == {}
    with pytest.raises(ValueError, match="must be a mapping"):
        _route_settings("[1, 2]")
    with pytest.raises(ValueError, match="not YAML"):
        _route_settings("{affinity: [")


def _decision(cached: int, chosen: str, **predicted: int) -> dict:
    backends = [{"name": name, "prefix_tokens": tokens} for name, tokens in predicted.items()]
    return {"prompt_tokens": 1_000, "cached_tokens": cached, "chosen": chosen, "backends": backends}


def test_a_miss_is_classed_by_what_the_decision_saw() -> None:
    assert miss_class(_decision(900, "a", a=900, b=0)) is None
    assert miss_class(_decision(0, "a", a=100, b=200)) == "cold"
    assert miss_class(_decision(0, "b", a=900, b=0)) == "moved"
    assert miss_class(_decision(100, "a", a=900, b=0)) == "lost"
    requests, share, misses = breakdown([_decision(900, "a", a=900), _decision(0, "a", a=900)])
    assert (requests, share, dict(misses)) == (2, 0.45, {"lost": 1})
    assert row_of(Path("events-p2-gsp-zipf-seed3-gateway.jsonl")) == "events-p2-gsp-zipf"
