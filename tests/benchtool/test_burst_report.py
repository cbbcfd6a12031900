"""The burst benchmark's arithmetic on known inputs: gateway counters, the hosted-share bound, the verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from spillgate.gateway.bench.arrivals import burst_spec, parse_rate_schedule
from tests.bench.burst import markdown_table, min_hosted_share, steady_spill_lines, validity, verdicts
from tests.bench.burst_stack import HOSTED, SETUPS, GatewayCounters, StackSpec, gateway_config

METRICS = """\
# HELP spillgate_spend_usd_total What requests cost.
# TYPE spillgate_spend_usd_total counter
spillgate_spend_usd_total{backend="llama-8b-0",kind="replica",route="bench",tenant="all"} 0.25
spillgate_spend_usd_total{backend="llama-8b-1",kind="replica",route="bench",tenant="all"} 0.5
spillgate_spend_usd_total{backend="frontier",kind="hosted",route="bench",tenant="all"} 3.0
# TYPE spillgate_hosted_equivalent_usd_total counter
spillgate_hosted_equivalent_usd_total{route="bench",tenant="all"} 10.0
# TYPE spillgate_requests_total counter
spillgate_requests_total{backend="llama-8b-0",outcome="ok",reason="prefix_hit",route="bench"} 40.0
spillgate_requests_total{backend="frontier",outcome="ok",reason="overflow",route="bench"} 12.0
spillgate_requests_total{backend="llama-8b-1",outcome="ok",reason="least_ttft",route="bench"} 3.0
"""


def test_gateway_counters_sum_by_kind_and_reason() -> None:
    counters = GatewayCounters.parse(METRICS)
    assert counters.spend_usd == {"replica": pytest.approx(0.75), "hosted": pytest.approx(3.0)}
    assert counters.total_usd == pytest.approx(3.75)
    assert counters.hosted_equivalent_usd == pytest.approx(10.0)
    assert counters.by_reason() == {"prefix_hit": 40, "overflow": 12, "least_ttft": 3}
    run = GatewayCounters.parse(METRICS.replace("3.0\n", "5.0\n", 1)).minus(counters)
    assert run.spend_usd["hosted"] == pytest.approx(2.0) and run.spend_usd["replica"] == pytest.approx(0.0)
    assert run.by_reason() == {}, "no request counted between the two scrapes"


def test_min_hosted_share_is_the_burst_excess() -> None:
    schedule = parse_rate_schedule(burst_spec(burst_s=60, steady_s=60), capacity_rps=1.0)
    assert min_hosted_share(schedule, 1.0) == pytest.approx(120 / 252)  # 2 x 60 of 0.6 x 120 + 3 x 60
    longer = parse_rate_schedule(burst_spec(burst_s=60, steady_s=150), capacity_rps=1.0)
    assert min_hosted_share(longer, 1.0) == pytest.approx(1 / 3)


def test_gateway_config_scales_slo_and_priors_to_wall_time() -> None:
    spec = StackSpec(replicas=2, time_scale=0.25, max_running=1, output_tokens_per_s=10.0)
    spill = gateway_config(spec, SETUPS[2], 9000, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "http://127.0.0.1:3")
    assert spill["routes"][0]["targets"] == ["llama-8b", HOSTED]
    assert spill["tenants"][0]["slo"] == {"ttft_ms": 250.0, "tpot_ms": 12.5}
    hosted = spill["hosted_models"][0]
    assert (hosted["ttft_ms"], hosted["tpot_ms"], hosted["api_base"]) == (87.5, 3.0, "http://127.0.0.1:3/v1")
    assert spill["pools"][0]["prefill_tokens_per_s"] == 80000.0
    assert "pools" not in gateway_config(spec, SETUPS[1], 9000, [], "http://127.0.0.1:3")
    assert "hosted_models" not in gateway_config(spec, SETUPS[0], 9000, ["http://127.0.0.1:1"], None)


def _row(setup: str, *, cost: float, burst: float, steady_spills: int, log: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "setup": setup,
        "ttft_attainment_pct": 99.5,
        "ttft_attainment_burst_pct": burst,
        "ttft_attainment_steady_pct": 100.0,
        "ttft_p50_ms": 400.0,
        "ttft_p99_ms": 900.0,
        "goodput_rps": 1.5,
        "cost_usd": cost,
        "hosted_equivalent_usd": 10.0,
        "to_hosted_pct": 30.0,
        "to_hosted_steady": steady_spills,
        "steady_requests": 100,
        "phases": [
            {"phase": 1, "rate_rps": 0.6, "start_s": 0.0},
            {"phase": 2, "rate_rps": 3.0, "start_s": 10.0},
            {"phase": 3, "rate_rps": 0.6, "start_s": 20.0},
        ],
        "request_log": log,
    }


def _req(at: float, phase: int, backend: str, ttft: float = 400.0, e2e: float = 600.0) -> dict[str, Any]:
    return {
        "at_s": at,
        "phase": phase,
        "steady": phase != 2,
        "backend": backend,
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "error": None,
    }


def test_verdicts_and_steady_spills() -> None:
    spill_log = [
        _req(1.0, 1, "llama-8b-0"),
        _req(1.2, 1, "llama-8b-1"),
        _req(1.3, 1, HOSTED),  # both replicas busy
        _req(12.0, 2, HOSTED),
        _req(21.0, 3, HOSTED),
    ]
    replicas_log = [_req(1.0, 1, "llama-8b-0"), _req(1.2, 1, "llama-8b-1"), _req(1.3, 1, "llama-8b-0", ttft=700.0)]
    rows = [
        _row("replicas only", cost=1.0, burst=10.0, steady_spills=0, log=replicas_log),
        _row("hosted only", cost=10.0, burst=100.0, steady_spills=0, log=[]),
        _row("spillgate", cost=3.5, burst=99.5, steady_spills=2, log=spill_log),
    ]
    lines = verdicts(rows)
    assert lines[0].startswith("- spillgate keeps TTFT SLO attainment >= 99% through the burst: MET")
    assert "replicas only does not: as expected" in lines[1]
    assert "spends <= 40% of hosted only: MET" in lines[2] and "35.0%" in lines[2]
    assert "sends nothing to hosted when the replicas can meet the SLO: MISSED (2 of 100" in lines[3]
    before, after = steady_spill_lines(rows[2], rows[0])
    assert "phase 1 (before the burst): 1 spilled, at +1.3 s; replicas busy then (requests in flight): 2" in before
    assert "replicas only served the same requests with TTFT 700 ms (1 of 1 within the SLO)" in before
    assert after.startswith("  phase 3 (after the burst): 1 spilled, at +1.0 s") and "replicas only" not in after

    table = markdown_table(rows).splitlines()
    assert len(table) == 5 and table[0].startswith("| setup | TTFT SLO met, whole run | TTFT SLO met, burst")
    assert table[4].startswith(
        "| **spillgate** | 99.5% | 99.5% | 400 / 900 | 1.50 | 3.500 | 35.0% | 30.0% | 2 of 100 |"
    )


def test_validity_flags_a_busy_machine() -> None:
    row = {
        "setup": "hosted only",
        "phases": [
            {"phase": 1, "cpu_cores": {"gateway": 0.2, "other work": 0.1}},
            {"phase": 2, "cpu_cores": {"gateway": 0.95, "other work": 0.8}},
        ],
    }
    lines = validity([row])
    assert lines == [
        "- hosted only, phase 2: the gateway used 0.95 cores (CPU-bound)",
        "- hosted only, phase 2: other processes used 0.80 of the machine's cores; latencies there include CPU "
        "contention (x 1 / time scale in simulated time)",
    ]
