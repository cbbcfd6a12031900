"""Spillgate ``cache_aware`` against sglang-router 0.3.2 and smg ``cache_aware``, in front of two real SGLang replicas.

Both routers get the same two SGLang 0.5.23 servers (the real-engine tier's, on this machine's CPU, serving the
tiny random model), with a KV pool small enough that the trace evicts, and the same slice of the Mooncake trace
shrunk to the tiny model's size (``spillgate bench --trace-block-tokens``). Every run starts from empty caches
(``/flush_cache``); the routers take turns, the first one alternating between repeats. A tiny model on a CPU
says nothing about GPU latency: these figures compare the two routers on real engines, nothing more.

    python -m tests.bench.real_routers --trace ../shared/traces/mooncake/synthetic_trace.jsonl --repeat 3

Rows (``--rows``): ``spillgate`` (its defaults: prefix blocks of characters, so its belief: events name token
ids, which only a config with the model's tokenizer can match), ``spillgate-events`` and ``spillgate-belief``
(prefix blocks of the served model's tokens, ``PREFIX_BLOCK_TOKENS``; on the replicas' KV events, or with the
pool's ``kv_events`` off: only the source differs), ``sglang-router`` and ``smg`` (Shepherd Model Gateway's
``cache_aware`` over HTTP workers). Every replica publishes its KV events (ZMQ, bound, with a replay socket), which
the peers ignore.

Needs ``make engines`` (SGLang's venv and the model); sglang-router and smg are installed into venvs of their own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.bench import router_env
from tests.engines.install import Installed, ensure
from tests.engines.servers import RECOMMENDED, SERVED_MODEL, start_engine
from tests.support.procs import REPO_ROOT, RunningProcess, free_port, start_process

API_KEY = "sk-spillgate-real-bench"
ROUTE = "bench"
ROWS = ("spillgate", "spillgate-events", "spillgate-belief", "sglang-router", "smg")
PEERS = ("sglang-router", "smg")
PREFIX_BLOCK_TOKENS = 16
"""The events and belief rows' prefix block, in the tiny model's tokens (SGLang's page is one token)."""


@dataclass(frozen=True)
class Settings:
    trace: Path
    records: int
    start: int
    block_tokens: int
    max_output: int
    speedup: float
    kv_tokens: int
    repeat: int
    out: Path | None
    pool: dict[str, Any]
    """More settings for spillgate's pool (``max_waiting_prefill_tokens``, ...), as the config takes them."""
    routers: tuple[str, ...] = ("spillgate", "sglang-router")
    """Which rows, of ``ROWS``."""


def trace_slice(settings: Settings, work: Path) -> Path:
    """``records`` consecutive records of the trace from ``start`` (negative: from the end), as their own file."""
    lines = [line for line in settings.trace.read_text().splitlines() if line.strip()]
    first = settings.start if settings.start >= 0 else len(lines) + settings.start
    path = work / "trace.jsonl"
    path.write_text("\n".join(lines[first : first + settings.records]) + "\n")
    return path


def spillgate_settings(row: str, model: Path, pool: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pool's settings, the config's ``prefix``) of a spillgate row."""
    if row == "spillgate":
        return pool, {}
    prefix = {"tokenizer": str(model), "block_tokens": PREFIX_BLOCK_TOKENS}
    return ({**pool, "kv_events": {"enabled": False}} if row == "spillgate-belief" else pool), prefix


def publisher_flags() -> tuple[str, ...]:
    """``--kv-events-config`` for a replica that publishes its KV events on fresh loopback ports, with a replay
    socket, bound as SGLang binds them (the gateway learns the endpoints from ``/server_info``)."""
    config = {
        "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "topic": "kv", "bind": True,
        "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
    }  # fmt: skip
    return ("--kv-events-config", json.dumps(config))


def start_spillgate(
    replicas: list[RunningProcess], log_dir: Path, pool: dict[str, Any], prefix: dict[str, Any] | None = None
) -> tuple[RunningProcess, str]:
    port = free_port()
    config: dict[str, Any] = {
        "pools": [
            {
                "name": "sglang",
                "served_model": SERVED_MODEL,
                "engine": "sglang",
                "replicas": [r.url for r in replicas],
                "prefill_tokens_per_s": 2000,  # a prior for a CPU; measured from the first tokens on
                **pool,
            }
        ],
        "routes": [{"name": ROUTE, "targets": ["sglang"], "policy": "cache_aware"}],
        "tenants": [{"name": "bench", "keys": [API_KEY]}],
        "health": {"interval_s": 0.5},
        "limits": {"max_connections_per_client": 0},  # the load generator is one address with many connections
        "state": {"data_dir": str(log_dir / f"spillgate-{port}")},
    }
    if prefix:
        config["prefix"] = prefix
    path = log_dir / f"spillgate-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(path), "--port", str(port)]
    proc = start_process(command, port=port, log_dir=log_dir, ready_path="/ready", timeout=60)
    time.sleep(2.0)  # a scrape of both replicas' limits and load
    return proc, ROUTE


def start_router(python: str, replicas: list[RunningProcess], log_dir: Path) -> tuple[RunningProcess, str]:
    port = free_port()
    command = [
        python, "-m", "sglang_router.launch_router", "--worker-urls", *[r.url for r in replicas],
        "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn",
        "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    proc = start_process(command, port=port, log_dir=log_dir, ready_path="/health", timeout=120, name="router")
    wait_routing(proc)
    return proc, SERVED_MODEL


def start_smg(binary: str, replicas: list[RunningProcess], log_dir: Path) -> tuple[RunningProcess, str]:
    """Shepherd Model Gateway over the replicas as HTTP workers, its defaults but the policy."""
    port = free_port()
    command = [
        binary, "launch", "--worker-urls", *[r.url for r in replicas], "--policy", "cache_aware",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn", "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    proc = start_process(command, port=port, log_dir=log_dir, ready_path="/health", timeout=120, name="smg")
    wait_routing(proc)
    return proc, SERVED_MODEL


def wait_routing(proc: RunningProcess, timeout_s: float = 120.0) -> None:
    """Until a chat completion through ``proc`` answers 200: a router's ``/health`` may answer before its workers
    are registered (smg's does), and a request sent meanwhile is a 404."""
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    deadline = time.monotonic() + timeout_s
    while httpx.post(proc.url + "/v1/chat/completions", json=body, timeout=60).status_code != 200:
        if time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"{proc.url} did not route a chat completion in {timeout_s:.0f} s")
        time.sleep(0.5)


def start_row(
    row: str,
    installed: Installed,
    peers: dict[str, str],
    replicas: list[RunningProcess],
    work: Path,
    settings: Settings,
) -> tuple[RunningProcess, str]:
    """The router of ``row`` in front of ``replicas``, and the model name its clients send."""
    if row == "sglang-router":
        return start_router(peers[row], replicas, work)
    if row == "smg":
        return start_smg(peers[row], replicas, work)
    pool, prefix = spillgate_settings(row, installed.model, settings.pool)
    return start_spillgate(replicas, work, pool, prefix)


def peer_binaries(rows: tuple[str, ...]) -> dict[str, str]:
    """The Python that runs sglang-router and the smg executable, for the rows that need them."""
    found: dict[str, str] = {}
    for row, locate in (("sglang-router", router_env.router_python), ("smg", router_env.smg_binary)):
        if row in rows:
            path, note = locate()
            if path is None:
                raise SystemExit(f"{row} unavailable: {note}")
            found[row] = path
    return found


def flush(replicas: list[RunningProcess]) -> None:
    """Empty both prefix caches; SGLang refuses while a request runs, so ask until it agrees."""
    for replica in replicas:
        deadline = time.monotonic() + 120
        while httpx.post(replica.url + "/flush_cache", timeout=30).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replica.url} would not flush its cache")
            time.sleep(0.5)


def bench(url: str, model: str, trace: Path, settings: Settings, out: Path) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "spillgate.gateway.cli", "bench", "--url", url, "--api-key", API_KEY, "--model", model,
        "--workload", f"trace:{trace}", "--trace-speedup", str(settings.speedup),
        "--trace-block-tokens", str(settings.block_tokens), "--trace-max-output-tokens", str(settings.max_output),
        "--slo-ttft-ms", "5000", "--slo-tpot-ms", "500", "--json", str(out), "--no-progress",
    ]  # fmt: skip
    subprocess.run(command, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["levels"][0]


def run(settings: Settings) -> list[dict[str, Any]]:
    installed = ensure(("sglang",))
    peers = peer_binaries(settings.routers)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spillgate-real-routers-") as tmp:
        work = Path(tmp)
        trace = trace_slice(settings, work)
        flags = (*RECOMMENDED["sglang"],)
        replicas = [
            start_engine(installed, "sglang", work, *flags, *publisher_flags(), kv_tokens=settings.kv_tokens)
            for _ in range(2)
        ]
        try:
            for index in range(settings.repeat):
                order = list(settings.routers) if index % 2 == 0 else list(reversed(settings.routers))
                for router in order:
                    flush(replicas)
                    proc, model = start_row(router, installed, peers, replicas, work, settings)
                    try:
                        level = bench(proc.url, model, trace, settings, work / f"{router}-{index}.json")
                        held = {**gateway_holds(proc), **index_sources(proc)} if router.startswith("spillgate") else {}
                    finally:
                        proc.stop()
                    rows.append({"router": router, "repeat": index, **summary(level), **held})
                    print(json.dumps(rows[-1]), file=sys.stderr)
        finally:
            for replica in replicas:
                replica.stop()
    return rows


def gateway_holds(proc: RunningProcess) -> dict[str, float]:
    """How often spillgate held a request at the gateway: for another's prefill of its prefix, or for room."""
    totals = {"prefill_waits": 0.0, "prompt_holds": 0.0, "ttft_seconds_sum": 0.0, "ttft_seconds_count": 0.0}
    for line in httpx.get(proc.url + "/metrics", timeout=10).text.splitlines():
        for name in totals:
            metric = f"spillgate_{name}" if name.startswith("ttft") else f"spillgate_{name}_total"
            if line.startswith(metric + "{"):
                totals[name] += float(line.rsplit(" ", 1)[1])
    count = totals.pop("ttft_seconds_count")
    # The gateway's TTFT runs from sending to the replica to its first token: the rest of the client's is the relay's.
    totals["gateway_ttft_mean_ms"] = totals.pop("ttft_seconds_sum") / count * 1000 if count else 0.0
    return totals


def index_sources(proc: RunningProcess) -> dict[str, Any]:
    """Where spillgate's prediction for each replica came from at the run's end (``events`` or ``belief``)."""
    backends = httpx.get(proc.url + "/health", timeout=30).json()["backends"]
    return {"sources": {name: b["prefix"].get("source") for name, b in backends.items() if "prefix" in b}}


def summary(level: dict[str, Any]) -> dict[str, Any]:
    return {
        "completed": level["requests"]["completed"],
        "failed": level["requests"]["failed"],
        "hit_rate": level["cache_hit_rate"],
        "ttft_p50_ms": level["ttft_ms"]["p50"],
        "ttft_mean_ms": level["ttft_ms"]["mean"],
        "ttft_p99_ms": level["ttft_ms"]["p99"],
        "tpot_p50_ms": level["tpot_ms"]["p50"],
        "tpot_p99_ms": level["tpot_ms"]["p99"],
        "errors": {kind: value["count"] for kind, value in level["errors"].items()},
        "backends": {name: value["requests"] for name, value in level["backends"].items()},
        "reasons": level["reasons"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| router | runs | requests ok / failed | hit rate | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for router in ROWS:
        mine = [r for r in rows if r["router"] == router]
        if not mine:
            continue

        def spread(key: str, scale: float = 1.0, digits: int = 0, rows: list[dict[str, Any]] = mine) -> str:
            values = [r[key] * scale for r in rows if r[key] is not None]
            mean = statistics.fmean(values)
            return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

        ok = sum(r["completed"] for r in mine)
        failed = sum(r["failed"] for r in mine)
        lines.append(
            f"| {router} | {len(mine)} | {ok} / {failed} | {spread('hit_rate', 100, 1)}% | "
            f"{spread('ttft_p50_ms')} | {spread('ttft_p99_ms')} | {spread('tpot_p50_ms', digits=1)} | "
            f"{spread('tpot_p99_ms', digits=1)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, required=True, help="a Mooncake-format JSONL trace")
    parser.add_argument("--records", type=int, default=300, help="records replayed per run")
    parser.add_argument("--start", type=int, default=-300, help="first record (negative: from the end)")
    parser.add_argument("--block-tokens", type=int, default=16, help="tokens per trace block (Mooncake's: 512)")
    parser.add_argument("--max-output", type=int, default=16, help="output tokens per request at most")
    parser.add_argument("--speedup", type=float, default=0.5, help="trace clock divided by this")
    parser.add_argument("--kv-tokens", type=int, default=12000, help="each replica's KV pool, in tokens")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write every run's figures here (JSON)")
    parser.add_argument("--pool", type=json.loads, default={}, help="more pool settings for spillgate, as JSON")
    parser.add_argument("--rows", default="spillgate,sglang-router", help=f"which, of {','.join(ROWS)}")
    parser.add_argument("--skip-router", action="store_true", help="spillgate's rows only")
    args = parser.parse_args(argv)
    chosen = tuple(row for row in args.rows.split(",") if row and not (args.skip_router and row in PEERS))
    unknown = sorted(set(chosen) - set(ROWS))
    if unknown or not chosen:
        parser.error(f"--rows: {', '.join(unknown) or 'none'}: choose among {', '.join(ROWS)}")
    settings = Settings(
        args.trace, args.records, args.start, args.block_tokens, args.max_output, args.speedup, args.kv_tokens,
        args.repeat, args.out, args.pool, chosen,
    )  # fmt: skip
    rows = run(settings)
    if settings.out is not None:
        settings.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
