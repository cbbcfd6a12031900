"""Rate schedules: parsing, phase boundaries, Poisson counts per phase, per-phase figures, and a real run."""

from __future__ import annotations

import argparse
import math
import random
from itertools import pairwise

import pytest

from spillgate.gateway.bench import BenchConfig, GspKnobs, run_bench
from spillgate.gateway.bench.arrivals import Phase, RateSchedule, burst_spec, parse_rate_schedule
from spillgate.gateway.bench.cli import add_arguments, config_from_args
from spillgate.gateway.bench.client import RequestResult
from spillgate.gateway.bench.stats import Slo, summarize_phases
from tests.support.procs import RunningProcess

# Parsing -------------------------------------------------------------------------------------------


def test_absolute_and_relative_rates() -> None:
    schedule = parse_rate_schedule("2:30, 0.6x:60,3x:15 ,0:5", capacity_rps=10.0)
    assert schedule.phases == (
        Phase(rate=2.0, duration_s=30.0, label="2"),
        Phase(rate=pytest.approx(6.0), duration_s=60.0, label="0.6x"),
        Phase(rate=30.0, duration_s=15.0, label="3x"),
        Phase(rate=0.0, duration_s=5.0, label="0"),
    )
    assert schedule.duration_s == 110.0
    assert "0.6x 6/s 60s" in schedule.describe() and "2/s 30s" in schedule.describe()


def test_burst_spec_is_steady_peak_steady() -> None:
    assert burst_spec() == "0.6x:60,3x:60,0.6x:60"
    schedule = parse_rate_schedule(burst_spec(burst_s=20, steady_s=45), capacity_rps=5.0)
    assert [(p.rate, p.duration_s) for p in schedule.phases] == [
        (pytest.approx(3.0), 45.0),
        (15.0, 20.0),
        (pytest.approx(3.0), 45.0),
    ]


@pytest.mark.parametrize(
    ("spec", "capacity", "message"),
    [
        ("", None, "expected RATE:SECONDS"),
        ("2:10,", None, "expected RATE:SECONDS"),
        ("2", None, "entry 1 '2'"),
        ("fast:10", None, "entry 1"),
        ("-2:10", None, "entry 1"),
        ("2:10,3:0", None, "entry 2 '3:0': a phase must last more than 0 seconds"),
        ("0.6x:60", None, "relative (Nx): pass a positive --capacity-rps"),
        ("0.6x:60", 0.0, "relative (Nx)"),
        ("0:10,0x:5", 4.0, "every phase has rate 0"),
    ],
)
def test_malformed_schedules_name_the_entry(spec: str, capacity: float | None, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rate_schedule(spec, capacity)


def test_config_validates_the_schedule_and_its_exclusivity() -> None:
    base = BenchConfig(url="http://127.0.0.1:1", rate_schedule="1x:10", capacity_rps=3.0)
    base.validate()
    assert base.mode == "schedule" and base.schedule().phases[0].rate == 3.0
    with pytest.raises(ValueError, match="exclusive"):
        BenchConfig(url="http://127.0.0.1:1", rate=1.0, rate_schedule="1:10").validate()
    with pytest.raises(ValueError, match="exclusive"):
        BenchConfig(url="http://127.0.0.1:1", concurrency=(2,), rate_schedule="1:10").validate()
    with pytest.raises(ValueError, match="relative"):
        BenchConfig(url="http://127.0.0.1:1", rate_schedule="1x:10").validate()
    with pytest.raises(ValueError, match="capacity-rps must be positive"):
        BenchConfig(url="http://127.0.0.1:1", rate_schedule="1:10", capacity_rps=-1.0).validate()


def test_cli_writes_out_the_burst_scenario() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--url", "http://127.0.0.1:1", "--workload", "gsp", "--rate-schedule", "burst", "--capacity-rps", "4"]
    config = config_from_args(parser.parse_args([*argv, "--burst-seconds", "30", "--steady-seconds", "90"]))
    assert config.rate_schedule == "0.6x:90,3x:30,0.6x:90", "the JSON report shows what was sent, not 'burst'"
    assert config.capacity_rps == 4.0
    explicit = config_from_args(parser.parse_args([*argv[:4], "--rate-schedule", "5:10,1:10"]))
    assert explicit.rate_schedule == "5:10,1:10" and explicit.capacity_rps is None
    with pytest.raises(SystemExit):  # argparse: not allowed with --rate
        parser.parse_args([*argv, "--rate", "3"])


# Phase boundaries ----------------------------------------------------------------------------------


def test_phase_boundaries_belong_to_the_phase_they_start() -> None:
    schedule = parse_rate_schedule("1:10,5:20,1:10")
    assert schedule.bounds() == [(0.0, 10.0), (10.0, 30.0), (30.0, 40.0)]
    assert schedule.phase_at(0.0) == 0
    assert schedule.phase_at(9.999) == 0
    assert schedule.phase_at(10.0) == 1
    assert schedule.phase_at(29.999) == 1
    assert schedule.phase_at(30.0) == 2
    assert schedule.phase_at(39.999) == 2
    assert schedule.phase_at(40.0) is None, "the end is outside the schedule"
    assert schedule.phase_at(-0.001) is None
    assert RateSchedule(()).phase_at(0.0) is None


# Poisson counts ------------------------------------------------------------------------------------


def test_poisson_counts_per_phase() -> None:
    """Each phase's count is Poisson(rate x length): within 4 sigma, with the rate stepping at the boundary."""
    schedule = parse_rate_schedule("0.6x:200,3x:100,0:50,0.6x:200", capacity_rps=10.0)
    offsets = list(schedule.offsets(random.Random(7)))
    assert all(b > a for a, b in pairwise(offsets)), "strictly increasing"
    assert offsets[0] > 0.0 and offsets[-1] < schedule.duration_s
    counts = [0] * len(schedule.phases)
    for offset in offsets:
        index = schedule.phase_at(offset)
        assert index is not None
        counts[index] += 1
    for phase, count in zip(schedule.phases, counts, strict=True):
        expected = phase.rate * phase.duration_s
        assert abs(count - expected) <= 4 * math.sqrt(expected) + 1e-9, (phase, count, expected)
    assert counts[2] == 0, "an idle phase sends nothing"


def test_counts_are_poisson_over_many_seeds() -> None:
    """Mean and variance of a phase's count both equal rate x length (Poisson), not just the mean."""
    schedule = parse_rate_schedule("2:5,8:5")
    samples = []
    for seed in range(400):
        offsets = list(schedule.offsets(random.Random(seed)))
        samples.append(sum(1 for offset in offsets if schedule.phase_at(offset) == 1))
    mean = sum(samples) / len(samples)
    variance = sum((s - mean) ** 2 for s in samples) / (len(samples) - 1)
    assert mean == pytest.approx(40.0, rel=0.05)
    assert variance == pytest.approx(40.0, rel=0.25)


def test_offsets_are_reproducible_and_finite() -> None:
    schedule = parse_rate_schedule("5:10,20:5")
    assert list(schedule.offsets(random.Random(3))) == list(schedule.offsets(random.Random(3)))
    assert list(schedule.offsets(random.Random(3))) != list(schedule.offsets(random.Random(4)))


# Per-phase figures ---------------------------------------------------------------------------------


def _result(scheduled: float, ttft: float, backend: str, reason: str = "least_ttft") -> RequestResult:
    return RequestResult(
        start=scheduled + 0.5,  # sent late: the phase is the schedule's, not the send time's
        scheduled=scheduled,
        ok=True,
        status=200,
        backend=backend,
        reason=reason,
        ttft=ttft,
        tpot=0.01,
        e2e=ttft + 0.1,
        completion_tokens=10,
    )


def test_phase_summaries_split_by_scheduled_arrival() -> None:
    schedule = parse_rate_schedule("1:10,3:10,1:10")
    results = [
        _result(1.0, 0.2, "r0"),
        _result(9.9, 0.3, "r1"),  # sent at 10.4, but scheduled in phase 1
        _result(10.0, 2.0, "r0"),
        _result(12.0, 0.4, "frontier", "overflow"),
        _result(15.0, 0.4, "frontier", "overflow"),
        _result(25.0, 0.2, "r1"),
        _result(31.0, 9.0, "r0"),  # past the schedule: in no phase
    ]
    phases = summarize_phases(results, schedule, slo=Slo(ttft_ms=1000, tpot_ms=50))
    assert [p.label for p in phases] == ["1:10", "3:10", "1:10"]
    assert [p.summary.finished for p in phases] == [2, 3, 1]
    burst = phases[1].summary
    assert burst.slo_attainment_pct == pytest.approx(200 / 3)
    assert burst.goodput == pytest.approx(0.2), "met per second of the phase"
    assert burst.backends == {"frontier": 2, "r0": 1}
    assert burst.reasons == {"overflow": 2, "least_ttft": 1}
    assert phases[0].summary.reasons == {"least_ttft": 2}
    cut = summarize_phases(results, schedule, slo=Slo(1000, 50), ran_s=15.0)
    assert [p.summary.duration_s for p in cut] == [10.0, 5.0, 0.0], "a stopped run's phases end where it stopped"


# A real run ----------------------------------------------------------------------------------------


async def test_schedule_run_reports_each_phase(replicas: list[RunningProcess]) -> None:
    config = BenchConfig(
        url=replicas[0].url,
        model="sim-model",
        workload="gsp",
        rate_schedule="10:1,0:0.5,40:1",
        gsp=GspKnobs(groups=2, prompts_per_group=4, system_tokens=128, question_tokens=16, output_tokens=4),
        seed=5,
    )
    result = await run_bench(config)
    [level] = result.levels
    assert level.label == "schedule" and not result.interrupted
    assert [phase.label for phase in level.phases] == ["10:1", "0:0.5", "40:1"]
    assert sum(phase.summary.finished for phase in level.phases) == level.summary.finished > 8, (
        "every request lands in one phase; the gsp workload cycles past its 8 prompts"
    )
    assert level.phases[1].summary.finished == 0
    assert level.phases[2].summary.finished > level.phases[0].summary.finished
    assert all(r.scheduled is not None and r.start >= r.scheduled - 0.01 for r in level.results)
