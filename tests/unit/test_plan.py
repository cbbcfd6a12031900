"""``spillgate plan`` reproduces the worked capacity estimate and rejects bad inputs with one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spillgate.gateway.bench.api import BenchResult, LevelResult
from spillgate.gateway.bench.config import BenchConfig
from spillgate.gateway.bench.report import to_json as bench_json
from spillgate.gateway.bench.stats import Distribution, Summary
from spillgate.gateway.cli import main
from spillgate.gateway.plan.bench_report import point_from_bench
from spillgate.gateway.plan.estimate import ceil_count, fleet, memory
from spillgate.gateway.plan.inputs import GPUS, MODELS, OperatingPoint, PlanError, Traffic
from tests.support.procs import REPO_ROOT

# The worked example (../shared/seed/): a RAG assistant on Llama 3.1 70B in FP8, TP 2 over 80 GB H100s,
# 3,000 input and 300 output tokens, 50 RPS peak with 30% headroom, average one third of peak, a hosted API
# at $3/$15 per million tokens, and load tests finding 48 concurrent requests at 1,140 output tok/s in SLO.
WORKLOAD = [
    "--input-tokens", "3000", "--output-tokens", "300", "--peak-rps", "50", "--headroom", "30%",
    "--avg-to-peak", "1/3", "--hosted-input-price", "3", "--hosted-output-price", "15",
]  # fmt: skip
SEED = ["plan", "--model", "llama-3.1-70b-fp8", "--gpu", "h100-80gb", "--tp", "2", *WORKLOAD]
SEED_POINT = ["--concurrency", "48", "--output-tps", "1140"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spillgate.gateway.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _check_seed_figures(plan: dict) -> None:
    """The figures and the rounding the worked example writes down."""
    assert plan["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680  # 320 KiB, bf16 KV
    assert plan["memory"]["weight_bytes"] == 70e9
    assert plan["memory"]["usable_bytes"] == 144e9  # 90% of 2 x 80 GB
    assert plan["kv_capacity_bytes"] == 74e9
    assert plan["memory"]["kv_bytes_per_request"] == 3300 * 327_680  # ~1.08 GB
    assert plan["memory_bound_concurrency"] == 68  # 74 / 1.08 = 68.4, "approximately 68"
    assert (plan["concurrency"], plan["output_tps"]) == (48, 1140)
    assert f"{plan['rps_per_replica']:.1f}" == "3.8"  # 1,140 / 300
    assert plan["fleet"]["required_rps"] == 65  # 50 x 1.3
    assert (plan["replicas"], plan["gpus"]) == (18, 36)  # 65 / 3.8 = 17.1, rounded up; x TP 2
    assert plan["gpu_cost_per_day"] == 2592  # 36 x $3 x 24, "approximately $2,600"
    assert round(plan["gpu_cost_per_day"], -2) == 2600
    hosted = plan["hosted"]
    assert hosted["requests_per_day"] == 1_440_000  # 50 / 3 x 86,400: "approximately 1.44 million"
    assert hosted["cost_per_day"] == plan["hosted_cost_per_day"] == 1_440_000 * (3000 * 3 + 300 * 15) / 1e6 == 19_440
    little = plan["littles_law"]
    assert f"{little['implied_request_s']:.1f}" == "12.6"  # 48 / 3.8
    assert round(little["implied_ms_per_output_token"]) == 42  # "300 tokens at roughly 42 ms per token"
    assert plan["warnings"] == []


def test_worked_example_through_the_cli_json() -> None:
    done = _cli(*SEED, *SEED_POINT, "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    plan = json.loads(done.stdout)
    assert plan["version"] == 1
    assert plan["inputs"]["point"]["bench"] is None
    _check_seed_figures(plan)


def test_worked_example_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEED, *SEED_POINT]) == 0
    table = capsys.readouterr().out
    for line in (
        "KV bytes per token                 320 KiB",
        "memory-bound concurrency                68",
        "RPS per replica                        3.8  1,140 / 300 output tokens",
        "replicas                                18  65 / 3.8, rounded up",
        "GPUs                                    36  18 x TP 2 h100-80gb",
        "GPUs at peak                        $2,592  36 x $3.00/GPU-hour x 24 h",
        "hosted API                         $19,440  1,440,000 requests/day at 1/3 of peak",
        "implied time per output token        42 ms",
    ):
        assert line in table, f"{line!r} not in\n{table}"


def test_presets_can_be_overridden_field_by_field(capsys: pytest.CaptureFixture[str]) -> None:
    """The 70B preset in bf16 plus --weight-dtype fp8 is the FP8 preset; a fully custom model works too."""
    custom = ["--params", "70B", "--layers", "80", "--kv-heads", "8", "--head-dim", "128"]
    for model in (
        ["--model", "llama-3.1-70b", "--weight-dtype", "fp8"],
        [*custom, "--weight-dtype", "fp8", "--kv-dtype", "bf16"],
    ):
        gpu = ["--gpu-memory-gb", "80", "--gpu-bandwidth-tbs", "3.35", "--gpu-price", "3"]
        assert main(["plan", *model, *gpu, "--tp", "2", *WORKLOAD, *SEED_POINT, "--json"]) == 0
        _check_seed_figures(json.loads(capsys.readouterr().out))


def test_kv_per_token_of_the_8b_example() -> None:
    """Llama 3.1 8B in bf16: 128 KiB per token, about 0.5 GB for a 4,000-token sequence."""
    traffic = Traffic(input_tokens=3700, output_tokens=300, peak_rps=1, headroom=0, avg_to_peak=1)
    mem = memory(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], 1, 0.9, traffic)
    assert mem.kv_bytes_per_token == 128 * 1024
    assert round(mem.kv_bytes_per_request / 1e9, 1) == 0.5


def test_replicas_round_up_without_float_noise() -> None:
    """38 / 3.8 is 10.000000000000002 in floats; that is 10 replicas, not 11."""
    traffic = Traffic(input_tokens=3000, output_tokens=300, peak_rps=38, headroom=0, avg_to_peak=1)
    assert fleet(OperatingPoint(48, 1140), traffic, GPUS["h100-80gb"], 2).replicas == 10
    assert ceil_count(10.2) == 11


def test_weights_that_do_not_fit_are_an_error() -> None:
    traffic = Traffic(input_tokens=3000, output_tokens=300, peak_rps=1, headroom=0, avg_to_peak=1)
    with pytest.raises(PlanError, match="do not fit"):
        memory(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], 1, 0.9, traffic)


# --from-bench ----------------------------------------------------------------------------------------------


def _summary(*, concurrency: int, tps: float, ttft_p95: float, tpot_p95: float, backends: int = 1) -> Summary:
    """A level of the worked example's load test: 300-token replies, requests lasting concurrency / RPS."""
    rps = tps / 300
    e2e = Distribution(p50=None, p95=None, p99=None, mean=1000 * concurrency / rps, count=100)
    names = {"-": 100} if backends == 1 else {f"r{i}": 100 // backends for i in range(backends)}
    return Summary(
        completed=100,
        failed=0,
        unfinished=0,
        duration_s=100 / rps,
        request_throughput=rps,
        output_throughput=tps,
        goodput=rps,
        slo_attainment_pct=100.0,
        ttft_ms=Distribution(p50=None, p95=ttft_p95, p99=None, mean=None, count=100),
        tpot_ms=Distribution(p50=None, p95=tpot_p95, p99=None, mean=None, count=100),
        e2e_ms=e2e,
        prompt_tokens=100 * 3000,
        completion_tokens=100 * 300,
        cached_tokens=0,
        cache_hit_rate=0.0,
        backends=names,
        backend_shares_pct={name: 100.0 / len(names) for name in names},
        errors={},
        error_examples={},
        reasons={"-": 100},
    )


def _bench_file(tmp_path: Path, *, backends: int = 1, concurrency: tuple[int, ...] = (16, 32, 48, 64)) -> Path:
    """A real ``spillgate bench --json`` document (written by the bench's own writer): 48 is the last level
    within TTFT <= 1000 ms and TPOT <= 50 ms; 64 barely adds throughput and breaks both."""
    shape = {16: (520, 300, 30), 32: (880, 450, 38), 48: (1140, 800, 45), 64: (1180, 1600, 62)}
    levels = [
        LevelResult(
            label=f"c={c}",
            concurrency=c,
            rate=None,
            summary=_summary(
                concurrency=c, tps=shape[c][0], ttft_p95=shape[c][1], tpot_p95=shape[c][2], backends=backends
            ),
            results=[],
        )
        for c in concurrency
    ]
    config = BenchConfig(url="http://127.0.0.1:30000", workload="chat", concurrency=concurrency)
    result = BenchResult(
        config=config, model="m", started_at="2025-01-01T00:00:00+00:00", levels=levels, interrupted=False
    )
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench_json(result)))
    return path


def test_operating_point_from_a_bench_report(tmp_path: Path) -> None:
    path = _bench_file(tmp_path)
    done = _cli(*SEED, "--from-bench", str(path), "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    _check_seed_figures(plan)
    bench = plan["inputs"]["point"]["bench"]
    assert bench["label"] == "c=48"
    assert bench["mean_output_tokens"] == 300
    little = plan["littles_law"]
    assert little["consistent"] is True and little["deviation_pct"] == pytest.approx(0, abs=1e-6)


def test_bench_slo_can_be_tightened(tmp_path: Path) -> None:
    point = point_from_bench(_bench_file(tmp_path), slo_ttft_ms=500, slo_tpot_ms=50)
    assert (point.concurrency, point.output_tps) == (32, 880)


def test_bench_level_served_by_several_replicas_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="served by 2 backends"):
        point_from_bench(_bench_file(tmp_path, backends=2))


# Validation: one line on stderr, exit 2, never a traceback ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "x"], "argument --tp: expected a whole number, got 'x'"),
        (["--tp", "0"], "argument --tp: must be at least 1"),
        (["--headroom", "lots"], "argument --headroom: expected a fraction like 0.3, 30% or 1/3"),
        (["--mem-fraction", "1.5"], "--mem-fraction must be in (0, 1], got 1.5"),
        (["--avg-to-peak", "2"], "--avg-to-peak must be in (0, 1]"),
        (["--output-tps", "nan"], "argument --output-tps: expected a finite number"),
        (["--gpu-price", "-3"], "argument --gpu-price: must not be negative"),
        (["--model", "gpt-5"], "argument --model: invalid choice: 'gpt-5'"),
        (["--tp", "1", "--mem-fraction", "0.5"], "the weights (70.0 GB) do not fit in 40.0 GB usable"),
        (["--from-bench", "bench.json"], "--from-bench takes the operating point from the report"),
        (["--slo-tpot-ms", "50"], "--slo-ttft-ms and --slo-tpot-ms pick a level of --from-bench"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main([*SEED, *SEED_POINT, *args])
    except SystemExit as exc:  # argparse's own checks exit; the rest return
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("spillgate plan: ")
    assert message in captured.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "48"], "pass the operating point: --concurrency N --output-tps T"),
        (["--from-bench", "missing.json"], "--from-bench: cannot read missing.json"),
        (["--from-bench", "pyproject.toml"], "--from-bench: pyproject.toml is not JSON"),
        (["--hosted-input-price", "3", "--hosted-output-price"], "argument --hosted-output-price: expected one"),
    ],
)
def test_bad_input_through_the_console_script(args: list[str], message: str) -> None:
    done = _cli(*SEED, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("spillgate plan: ") and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


def test_model_and_gpu_fields_are_required_without_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--layers", "80", *WORKLOAD, *SEED_POINT]) == 2
    assert "missing --params, --kv-heads, --head-dim, --weight-dtype, --kv-dtype" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3.1-8b", *WORKLOAD, *SEED_POINT]) == 2
    assert (
        "pass --gpu NAME or every GPU field (missing --gpu-memory-gb, --gpu-bandwidth-tbs)" in capsys.readouterr().err
    )


def test_bench_without_a_level_in_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _bench_file(tmp_path, concurrency=(64,))
    assert main([*SEED, "--from-bench", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no level of" in err and "p95 TTFT <= 1000 ms, TPOT <= 50 ms" in err and "c=64: TTFT 1600 ms" in err
    assert err.count("\n") == 1


def test_doubtful_figures_warn_but_still_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """A measured duration that contradicts the token rate, and a concurrency memory cannot hold, are warnings."""
    args = ["plan", "--model", "llama-3.1-70b-fp8", "--gpu", "h100-80gb", "--tp", "2", *WORKLOAD[:6]]
    assert main([*args, "--concurrency", "96", "--output-tps", "1140", "--mean-e2e-s", "20", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["hosted"] is None and plan["hosted_cost_per_day"] is None
    assert plan["littles_law"]["consistent"] is False
    assert [w.split(":")[0] for w in plan["warnings"]] == [
        "the operating point's concurrency (96) is above what memory allows (68)",
        "Little's law",
    ]
