"""Real runs against simulated replicas and a real gateway, through the Python API and the CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from spillgate.gateway.bench import BenchConfig, BenchError, ChatKnobs, GspKnobs, run_bench
from tests.support.gateway import TENANT_KEY
from tests.support.procs import REPO_ROOT, RunningProcess, free_port

SMALL_GSP = GspKnobs(groups=4, prompts_per_group=6, system_tokens=512, question_tokens=32, output_tokens=16)


def on_replica(replica: RunningProcess, **fields: Any) -> BenchConfig:
    """A run straight against one simulated replica."""
    return BenchConfig(url=replica.url, model="sim-model", **fields)


async def test_gsp_through_the_gateway_hits_the_cache_and_spreads(gateway: RunningProcess) -> None:
    config = BenchConfig(
        url=gateway.url, api_key=TENANT_KEY, model="chat", workload="gsp", concurrency=(4,), gsp=SMALL_GSP
    )
    result = await run_bench(config)
    [level] = result.levels
    summary = level.summary
    assert not result.interrupted
    assert (summary.completed, summary.failed, summary.unfinished) == (24, 0, 0)
    assert summary.cache_hit_rate is not None and summary.cache_hit_rate > 0
    assert sum(summary.backend_shares_pct.values()) == pytest.approx(100.0)
    assert "-" not in summary.backends, "the gateway names the backend of every answer"
    assert summary.completion_tokens == 24 * 16, "ignore_eos makes every reply exactly max_tokens long"
    assert summary.ttft_ms.p50 is not None and summary.tpot_ms.p99 is not None and summary.e2e_ms.p95 is not None


async def test_chat_later_turns_are_cached_on_one_replica(replicas: list[RunningProcess]) -> None:
    config = on_replica(
        replicas[0],
        workload="chat",
        rate=50.0,
        chat=ChatKnobs(sessions=3, turns=3, user_tokens=64, output_tokens=16),
        seed=11,
    )
    result = await run_bench(config)
    results = result.levels[0].results
    assert len(results) == 9 and all(r.ok for r in results)
    turns = sorted(results, key=lambda r: r.prompt_tokens)  # each turn is longer than the one before
    first, second, third = turns[:3], turns[3:6], turns[6:]
    assert all(r.cached_tokens < r.prompt_tokens - 64 for r in first), "a new seed: the opening message is new"
    assert all(r.cached_tokens >= max(p.prompt_tokens for p in first) for r in second), "turn 1 is cached"
    assert all(r.cached_tokens >= max(p.prompt_tokens for p in second) for r in third), "turn 2 is cached"
    assert all(r.backend == "-" for r in results), "a replica sends no x-spillgate-backend"


async def test_warmup_requests_load_the_replica_but_are_not_counted(replicas: list[RunningProcess]) -> None:
    config = on_replica(
        replicas[2],
        workload="gsp",
        rate=40.0,
        num_requests=40,
        warmup_s=0.5,
        gsp=GspKnobs(groups=2, prompts_per_group=20, system_tokens=512, question_tokens=16, output_tokens=4),
        seed=23,
    )
    result = await run_bench(config)
    [level] = result.levels
    assert len(level.results) == 40 and all(r.ok for r in level.results)
    warm = [r for r in level.results if r.scheduled is not None and r.scheduled < 0.5]
    counted = [r for r in level.results if r.scheduled is not None and r.scheduled >= 0.5]
    assert warm and counted, "Poisson at 40/s puts requests on both sides of 0.5 s"
    assert level.warmup_requests == len(warm)
    assert level.summary.completed == len(counted) == len(level.measured)
    assert level.summary.ttft_ms.count == len(counted)
    assert level.summary.prompt_tokens == sum(r.prompt_tokens for r in counted)
    # Only the warm-up paid for the two system prompts: every counted request finds its prompt cached.
    assert all(r.cached_tokens >= 400 for r in counted)
    assert min(r.cached_tokens for r in warm) < 400
    assert level.summary.duration_s == pytest.approx(max(r.start + r.e2e for r in level.results) - 0.5, abs=0.1)


def test_warmup_must_fit_the_run() -> None:
    BenchConfig(url="http://127.0.0.1:1", rate=1.0, duration_s=10.0, warmup_s=2.0).validate()
    with pytest.raises(ValueError, match="--warmup must be zero or positive"):
        BenchConfig(url="http://127.0.0.1:1", rate=1.0, warmup_s=-1.0).validate()
    with pytest.raises(ValueError, match="--warmup must be shorter than --duration"):
        BenchConfig(url="http://127.0.0.1:1", rate=1.0, duration_s=2.0, warmup_s=2.0).validate()


async def test_a_session_script_replays_the_turns_a_run_sent(replicas: list[RunningProcess]) -> None:
    knobs = ChatKnobs(sessions=4, turns=3, user_tokens=32, output_tokens=8)
    live = on_replica(replicas[0], workload="chat", rate=200.0, chat=knobs, seed=31)
    sent = sorted((await run_bench(live)).levels[0].results, key=lambda r: r.start)
    script = tuple(r.session for r in sent if r.session is not None)
    assert len(script) == 12 and sorted(set(script)) == [0, 1, 2, 3]
    replay = dataclasses.replace(live, rate=None, concurrency=(1,), num_requests=12, session_script=script)
    replayed = sorted((await run_bench(replay)).levels[0].results, key=lambda r: r.start)
    assert [r.session for r in replayed] == list(script)
    assert [r.prompt_tokens for r in replayed] == [r.prompt_tokens for r in sent], "the same turns, in order"
    with pytest.raises(BenchError, match="session script replays chat or agent turns at concurrency 1"):
        await run_bench(dataclasses.replace(replay, concurrency=(2,)))


async def test_several_urls_take_the_requests_in_turn(replicas: list[RunningProcess]) -> None:
    # The processes of one gateway behind no load balancer: requests rotate over them, one after another.
    first, second = replicas[0], replicas[2]
    before = [requests_served(first), requests_served(second)]
    config = dataclasses.replace(
        on_replica(first, workload="gsp", concurrency=(1,), num_requests=10, gsp=SMALL_GSP, seed=41),
        more_urls=(second.url + "/v1",),
    )
    summary = (await run_bench(config)).levels[0].summary
    assert summary.completed == 10 and summary.failed == 0
    assert [requests_served(first) - before[0], requests_served(second) - before[1]] == [5, 5]
    with pytest.raises(BenchError, match="--url must be an http"):
        await run_bench(dataclasses.replace(config, more_urls=("127.0.0.1:1",)))


def requests_served(replica: RunningProcess) -> int:
    """The replica's own count of the requests it answered (``sglang:num_requests_total``, over its labels)."""
    metrics = httpx.get(replica.url + "/metrics", timeout=10).text
    return round(
        sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("sglang:num_requests_total"))
    )


async def test_stop_gives_a_partial_report(replicas: list[RunningProcess]) -> None:
    stop = asyncio.Event()
    config = on_replica(
        replicas[1],
        workload="gsp",
        concurrency=(2, 4),
        gsp=GspKnobs(groups=2, prompts_per_group=500, system_tokens=256, question_tokens=16, output_tokens=200),
    )
    run = asyncio.create_task(run_bench(config, stop=stop))
    await asyncio.sleep(0.5)
    stop.set()
    result = await asyncio.wait_for(run, 30)
    assert result.interrupted
    assert len(result.levels) == 1, "the sweep's later levels are skipped"
    summary = result.levels[0].summary
    assert summary.failed == 0
    assert summary.completed + summary.unfinished <= 1000


async def test_unreachable_url_reports_connect_errors() -> None:
    config = BenchConfig(
        url=f"http://127.0.0.1:{free_port()}",
        model="m",
        workload="gsp",
        concurrency=(2,),
        num_requests=4,
        gsp=SMALL_GSP,
        connect_timeout_s=1.0,
    )
    summary = (await run_bench(config)).levels[0].summary
    assert summary.errors == {"connect": 4} and summary.completed == 0
    assert summary.backend_shares_pct == {"-": 100.0}


def test_cli_sweep_end_to_end_with_json(replicas: list[RunningProcess], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 20 * i, "input_length": 700, "output_length": 8, "hash_ids": [1, 2 + i]}) + "\n"
            for i in range(6)
        )
    )
    base = [sys.executable, "-m", "spillgate.gateway.cli", "bench", "--url", replicas[2].url, "--no-progress"]
    gsp = [*base, "--workload", "gsp", "--concurrency", "1,3", "--num-requests", "6", "--json", str(out)]
    gsp += [
        "--gsp-groups",
        "2",
        "--gsp-system-tokens",
        "256",
        "--gsp-question-tokens",
        "16",
        "--gsp-output-tokens",
        "8",
    ]
    done = subprocess.run(gsp, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "TTFT ms p50/p95/p99" in done.stdout and "cache hit" in done.stdout
    assert "\nc=1 " in done.stdout and "\nc=3 " in done.stdout, "one row per concurrency level"

    report = json.loads(out.read_text())
    assert {"version", "model", "started_at", "interrupted", "config", "levels"} <= report.keys()
    assert report["config"]["concurrency"] == [1, 3] and report["config"]["mode"] == "concurrency"
    assert report["model"] == "sim-model", "discovered from /v1/models"
    assert [level["label"] for level in report["levels"]] == ["c=1", "c=3"]
    for level in report["levels"]:
        assert {
            "requests",
            "duration_s",
            "request_throughput_rps",
            "output_throughput_tps",
            "goodput_rps",
            "slo_attainment_pct",
            "ttft_ms",
            "tpot_ms",
            "e2e_ms",
            "tokens",
            "cache_hit_rate",
            "backends",
            "errors",
        } <= level.keys()
        assert {"p50", "p95", "p99", "mean", "count"} <= level["ttft_ms"].keys()
        assert level["requests"] == {"completed": 6, "failed": 0, "unfinished": 0}
        assert level["tokens"]["completion"] == 6 * 8
        assert sum(b["share_pct"] for b in level["backends"].values()) == pytest.approx(100.0)

    # Records every 2 ms once sped up; the first three (0, 2 and 4 ms) are the warm-up.
    replay = [*base, "--workload", f"trace:{trace}", "--trace-speedup", "10", "--warmup", "0.005"]
    done = subprocess.run(replay, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "trace x10" in done.stdout
    assert "warm-up: the 3 requests sent in the first 0.005s are not counted" in done.stdout

    bad = subprocess.run([*base, "--workload", "gsp"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--concurrency" in bad.stderr


def test_cli_refuses_what_cannot_work_and_fails_a_run_with_no_answer(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    base = [sys.executable, "-m", "spillgate.gateway.cli", "bench", "--no-progress"]
    base += ["--model", "m", "--workload", "gsp"]
    small = ["--gsp-groups", "1", "--gsp-prompts-per-group", "2", "--concurrency", "1"]

    def bench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)

    for bad, says in [
        (["--url", dead, "--rate", "nan"], "finite"),
        (["--url", dead, *small, "--duration", "nan"], "finite"),
        (["--url", dead, *small, "--slo-ttft-ms", "-1"], "--slo-ttft-ms"),
        (["--url", "http://127.0.0.1:99999", *small], "invalid port"),
        (["--url", dead, *small, "--json", str(tmp_path / "missing" / "out.json")], "existing directory"),
        (["--url", dead, *small, "--json", str(tmp_path)], "existing directory"),
    ]:
        done = bench(*bad)
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, (bad, done.stderr)
    # Every request failed (nothing listens there): the report is printed, and the exit status says so.
    done = bench("--url", dead, *small, "--json", str(tmp_path / "out.json"))
    assert done.returncode == 1 and "no request succeeded" in done.stderr, done.stderr
    assert json.loads((tmp_path / "out.json").read_text())["levels"][0]["requests"]["failed"] == 2


def running_requests(replica: RunningProcess) -> float:
    metrics = httpx.get(replica.url + "/metrics", timeout=5).text
    line = next(line for line in metrics.splitlines() if line.startswith("sglang:num_running_reqs"))
    return float(line.rsplit(" ", 1)[1])


def test_cli_ctrl_c_prints_a_partial_report(replicas: list[RunningProcess]) -> None:
    command = [sys.executable, "-m", "spillgate.gateway.cli", "bench", "--url", replicas[1].url, "--workload", "gsp"]
    command += ["--concurrency", "2", "--gsp-groups", "2", "--gsp-system-tokens", "256", "--gsp-output-tokens", "4000"]
    deadline = time.monotonic() + 30
    while running_requests(replicas[1]) > 0:  # requests another test cut off must not look like this run's
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while running_requests(replicas[1]) < 1:  # the signal handler is installed before the first request
            assert proc.poll() is None and time.monotonic() < deadline, "the bench never started sending"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "interrupted: partial results" in stdout and "\nc=2 " in stdout
    assert "stopping" in stderr
