"""What the access log costs the relay, per request: in CPU time, or in instructions that no other work moves.

Requests per second on one core move with whatever else runs (on a shared 2-core VM, by more than the 10%
the log may cost). Two steadier meters, each comparing the relay with the access log off and then on (json or
logfmt):

- ``--meter cpu``: each runs on its own core under ``wrk`` at 64 connections (non-streaming) and 32
  (streaming), alternating, and the gateway's CPU time (every thread, from ``/proc/PID/stat``) is divided by
  the requests it relayed. On a saturated core throughput is the inverse of that figure.
- ``--meter instructions``: the gateway runs under valgrind's callgrind, which counts the instructions each
  thread executes, whatever else the machine does; counters are zeroed after a warm-up, then a fixed number of
  requests (8 at a time) is sent. The event loop's thread is the request's critical path; the access log's
  writer thread is not. Python runs about 50 times slower under callgrind: a gateway takes about two minutes
  to start.

    .venv/bin/python -m tests.bench.access_log_cost [--meter cpu|instructions] [--rounds 4] [--seconds 5]
        [--requests 400] [--access-log json]

Every server is stopped by its PID, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import yaml

from tests.bench import targets
from tests.bench.services import Service, free_port, http_request, run_script, start_pinned, wait_until
from tests.bench.workload import Workload
from tests.bench.wrk import ensure_wrk, run_wrk

CONNECTIONS = {"json": 64, "stream": 32}
"""wrk connections per kind of request, as in ``hot_path``."""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of every thread of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, stub_port: int, wrk: str, work_dir: Path, seconds: float, cores: tuple[int, int]) -> dict:
    """CPU microseconds per request and requests/s of one gateway with the access log ``mode`` (or ``off``)."""
    server_cpu, client_cpu = cores
    port = free_port()
    argv = targets.gateway_argv(work_dir / f"spillgate-{mode}.yaml", stub_port, port, mode)
    gateway = start_pinned(f"spillgate-{mode}", argv, cpu=server_cpu, log_dir=work_dir)
    try:
        wait_until(gateway, lambda: http_request(f"http://127.0.0.1:{port}/ready")[0] == 200, timeout=30, what="ready")
        workload = Workload(port=port, model=targets.ROUTE, api_key=targets.API_KEY)
        row: dict[str, float] = {}
        for kind, connections in CONNECTIONS.items():
            script = work_dir / f"{mode}-{kind}.lua"
            script.write_text(workload.wrk_script(kind == "stream"))
            run_wrk(wrk, workload.url, script, connections=connections, seconds=1, cpu=client_cpu)  # warm-up
            before = cpu_seconds(gateway.pid)
            result = run_wrk(wrk, workload.url, script, connections=connections, seconds=seconds, cpu=client_cpu)
            spent = cpu_seconds(gateway.pid) - before
            if result.non_2xx or result.socket_errors or not result.requests:
                raise RuntimeError(f"{mode} {kind}: {result}\n{gateway.log_tail()}")
            row[f"{kind}_us_per_request"] = spent / result.requests * 1e6
            row[f"{kind}_per_second"] = result.per_second
        return row
    finally:
        gateway.stop()


def count_instructions(mode: str, stub_port: int, work_dir: Path, requests: int) -> dict[str, float]:
    """Instructions per request of one gateway with the access log ``mode`` (or ``off``), under callgrind: on
    the event loop's thread, and on every other thread together."""
    port = free_port()
    config_path = work_dir / f"spillgate-{mode}.yaml"
    argv = targets.gateway_argv(config_path, stub_port, port, mode)
    config = yaml.safe_load(config_path.read_text())
    # 50 times slower, the gateway must not take its own late probes for a dead replica.
    config["health"] = {"interval_s": 30, "timeout_s": 60, "unhealthy_after": 100, "generation_check_s": 0}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = work_dir / f"callgrind-{mode}"
    callgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}.%p"]
    os.environ["PYTHONMALLOC"] = "malloc"  # valgrind sees each allocation; the arena allocator only adds noise
    gateway = start_pinned(
        f"spillgate-{mode}", [*callgrind, *argv], cpu=os.sched_getaffinity(0).pop(), log_dir=work_dir
    )
    try:
        ready = f"http://127.0.0.1:{port}/ready"
        wait_until(gateway, lambda: http_request(ready)[0] == 200, timeout=600, what="ready under callgrind")
        row: dict[str, float] = {}
        for kind in CONNECTIONS:
            asyncio.run(_send(port, 40, stream=kind == "stream"))  # warm-up, not counted
            subprocess.run(["callgrind_control", "--zero", str(gateway.pid)], check=True, capture_output=True)
            asyncio.run(_send(port, requests, stream=kind == "stream"))
            subprocess.run(["callgrind_control", "--dump", str(gateway.pid)], check=True, capture_output=True)
            dumps = list(out.parent.glob(f"{out.name}.{gateway.pid}.*"))
            threads = _thread_totals(dumps)
            for dump in dumps:
                dump.rename(dump.with_name(f"{kind}-{dump.name}"))
            row[f"{kind}_loop_per_request"] = threads[0] / requests
            row[f"{kind}_others_per_request"] = sum(threads[1:]) / requests
        return row
    finally:
        gateway.stop(timeout=30)


async def _send(port: int, count: int, *, stream: bool, concurrency: int = 8) -> None:
    workload = Workload(port=port, model=targets.ROUTE, api_key=targets.API_KEY)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:

        async def one() -> None:
            async with gate:
                answer = await client.post(workload.url, content=workload.body(stream), headers=workload.headers())
                if answer.status_code != 200:
                    raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")

        await asyncio.gather(*(one() for _ in range(count)))


def _thread_totals(dumps: object) -> list[int]:
    """Each thread's instruction count in callgrind's per-thread dump files, the first thread first."""
    totals: dict[int, int] = {}
    for path in dumps:  # type: ignore[attr-defined]
        thread = int(re.search(r"-(\d+)$", path.name).group(1))
        found = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.MULTILINE)
        totals[thread] = int(found.group(1)) if found else 0
    return [totals[thread] for thread in sorted(totals)]


def run_instructions(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind (with callgrind_control) is required for --meter instructions")
    work_dir = Path(tempfile.mkdtemp(prefix="spillgate-logcost-"))
    stub_port = free_port()
    stub = start_pinned("stub", targets.stub_argv(stub_port), cpu=os.sched_getaffinity(0).pop(), log_dir=work_dir)
    rows: dict[str, dict[str, float]] = {}
    try:
        wait_until(stub, lambda: http_request(f"http://127.0.0.1:{stub_port}/v1/models")[0] == 200, timeout=30,
                   what="stub")  # fmt: skip
        for mode in ("off", args.access_log):
            rows[mode] = count_instructions(mode, stub_port, work_dir, args.requests)
            print(mode, "  ".join(f"{key} {value:,.0f}" for key, value in rows[mode].items()), flush=True)
    finally:
        stub.stop()
    if args.keep:
        print(f"callgrind's dumps kept in {work_dir} (callgrind_annotate FILE)")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f"\ninstructions per request, {args.requests} requests 8 at a time, under callgrind:")
    print("| access log | request (loop thread) | other threads | stream (loop thread) | other threads |")
    print("| --- | --- | --- | --- | --- |")
    for mode, row in rows.items():
        cells = " | ".join(
            f"{row[f'{kind}_{part}_per_request']:,.0f}" for kind in CONNECTIONS for part in ("loop", "others")
        )
        print(f"| {mode} | {cells} |")
    off, on = rows["off"], rows[args.access_log]
    for kind in CONNECTIONS:
        loop = on[f"{kind}_loop_per_request"] / off[f"{kind}_loop_per_request"] - 1
        total_off = off[f"{kind}_loop_per_request"] + off[f"{kind}_others_per_request"]
        total = on[f"{kind}_loop_per_request"] + on[f"{kind}_others_per_request"]
        print(f"{kind}: the log adds {loop:+.1%} on the event loop's thread and {total / total_off - 1:+.1%} in all")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.meter == "instructions":
        return run_instructions(args)
    wrk = ensure_wrk()
    allowed = sorted(os.sched_getaffinity(0))
    cores = (allowed[0], allowed[1 % len(allowed)])
    os.sched_setaffinity(0, {cores[1]})
    work_dir = Path(tempfile.mkdtemp(prefix="spillgate-logcost-"))
    stub_port = free_port()
    stub: Service = start_pinned("stub", targets.stub_argv(stub_port), cpu=cores[1], log_dir=work_dir)
    rows: dict[str, list[dict]] = {"off": [], args.access_log: []}
    try:
        wait_until(stub, lambda: http_request(f"http://127.0.0.1:{stub_port}/v1/models")[0] == 200, timeout=30,
                   what="stub")  # fmt: skip
        for round_number in range(args.rounds):
            for mode in rows:
                row = measure(mode, stub_port, wrk, work_dir, args.seconds, cores)
                rows[mode].append(row)
                figures = "  ".join(f"{key} {value:,.1f}" for key, value in row.items())
                print(f"round {round_number + 1} {mode:7} {figures}", flush=True)
    finally:
        stub.stop()
    shutil.rmtree(work_dir, ignore_errors=True)
    print(f"\nmedians over {args.rounds} rounds, {args.seconds:g} s a figure:")
    print("| access log | CPU us/request (json) | req/s | CPU us/stream | streams/s |")
    print("| --- | --- | --- | --- | --- |")
    medians = {}
    for mode, found in rows.items():
        medians[mode] = {key: statistics.median(row[key] for row in found) for key in found[0]}
        m = medians[mode]
        print(f"| {mode} | {m['json_us_per_request']:.1f} | {m['json_per_second']:,.0f} | "
              f"{m['stream_us_per_request']:.1f} | {m['stream_per_second']:,.0f} |")  # fmt: skip
    for kind in CONNECTIONS:
        key = f"{kind}_us_per_request"
        extra = medians[args.access_log][key] / medians["off"][key] - 1
        print(f"{kind}: the log adds {extra:+.1%} CPU per request, so {1 - 1 / (1 + extra):.1%} less throughput "
              "on a saturated core")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="off/on pairs, alternating (default 4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per figure (default 5)")
    parser.add_argument("--access-log", choices=["json", "logfmt"], default="json", help="the format compared")
    parser.add_argument("--meter", choices=["cpu", "instructions"], default="cpu", help="what is counted (default cpu)")
    parser.add_argument("--requests", type=int, default=400, help="--meter instructions: requests counted per kind")
    parser.add_argument("--keep", action="store_true", help="--meter instructions: keep callgrind's dumps")
    return run_script("access_log_cost", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
