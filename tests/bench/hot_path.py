"""What the gateway costs on the hot path, next to calling the backend directly and next to sglang-router.

A stub backend that answers at once (``stub_backend``) runs on one core with the load generators; the
gateway, and then sglang-router 0.3.2, run alone on the other, so each row shows what one core of relay
can do. Per row: added latency at one connection, non-streaming requests/s at 64 connections (wrk),
streams/s at 32 streaming connections (wrk), and time to first byte at 32 streaming connections paced at
1,500 streams/s (``loadgen``). Every server is stopped by its PID, also on Ctrl-C or an error.

With ``--workers N`` (N > 1) the gateway runs as ``spillgate serve --workers N`` (N processes on one port, sharing
a private Redis the gateway starts) and is allowed both cores, the relay's and the clients': its row is then what
the whole machine relays while it also runs the stub and the load generators, not one core's worth, and is
compared with the ``--workers 1`` row of another run (the direct and sglang-router rows keep one core). The
"other work" share of a figure counts every gateway process as the benchmark's own, on both cores.

With ``--redis`` one worker shares its state as the workers do: through a ``redis-server`` of the benchmark's own
on a unix socket, pinned to the clients' core. Against a run without it, that is what sharing costs one worker.

    .venv/bin/python -m tests.bench.hot_path [--seconds 5] [--json FILE] [--skip-router] [--check] [--workers N]
                                            [--redis]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml

from spillgate.gateway.supervisor import private_redis_argv
from tests.bench import report, router_env, smoke, targets
from tests.bench.core_load import NOISY_PERCENT, CoreWatch, wait_for_quiet
from tests.bench.services import REPO_ROOT, Service, free_port, http_request, start_pinned, wait_until
from tests.bench.workload import Workload
from tests.bench.wrk import WrkMissing, ensure_wrk, run_wrk

LATENCY_CONNECTIONS = 1
NONSTREAM_CONNECTIONS = 64
STREAM_CONNECTIONS = 32
PACED_RATE = 1500.0
WARMUP_S = 1.0
RETRY_BUDGET_FIGURES = 16
"""Retries stop once the run has taken as long as this many figures (12 are always measured)."""


@dataclass
class Bench:
    """How to measure: for how long, on which cores, with which wrk, writing scratch files where."""

    seconds: float
    client_cpu: int
    server_cpu: int
    wrk: str
    work_dir: Path
    stub_pid: int = 0
    retries: int = 1
    access_log: str = "json"
    """The relay's access log: ``json``, ``logfmt`` or ``off``."""
    retry_until: float = 0.0
    """No retries after this ``time.monotonic()``: they must not push the run past its time budget."""
    workers: int = 1
    """Gateway processes (``spillgate serve --workers``); more than one are allowed both cores."""
    redis: bool = False
    """One worker shares its state through a Redis of the benchmark's own (more than one always do)."""

    @property
    def gateway_cpus(self) -> str:
        """The cores the gateway may use, in ``taskset -c`` form."""
        if self.workers == 1 or self.client_cpu == self.server_cpu:
            return str(self.server_cpu)
        return f"{self.server_cpu},{self.client_cpu}"

    def measure(self, target: targets.Target, relay_pids: tuple[int, ...] = ()) -> dict[str, Any]:
        """The four figures for ``target``, each with how much of the two cores other processes took meanwhile."""
        workload = Workload(port=target.port, model=target.model, api_key=target.api_key)
        smoke.check_target(workload)
        figures: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
            (
                "latency",
                f"latency at {LATENCY_CONNECTIONS} connection",
                lambda: self._loadgen(workload, connections=LATENCY_CONNECTIONS),
            ),
            (
                "nonstream",
                f"non-streaming requests/s at {NONSTREAM_CONNECTIONS} connections",
                lambda: self._wrk(target.name, workload, stream=False, connections=NONSTREAM_CONNECTIONS),
            ),
            (
                "stream",
                f"streams/s at {STREAM_CONNECTIONS} connections",
                lambda: self._wrk(target.name, workload, stream=True, connections=STREAM_CONNECTIONS),
            ),
            (
                "ttfb",
                f"TTFB at {STREAM_CONNECTIONS} streaming connections, {PACED_RATE:g} streams/s",
                lambda: self._loadgen(workload, connections=STREAM_CONNECTIONS, rate=PACED_RATE, stream=True),
            ),
        ]
        row: dict[str, Any] = {}
        for key, title, run_figure in figures:
            row[key] = self._least_disturbed(f"{target.name}: {title}", run_figure, relay_pids)
        return row

    def _least_disturbed(
        self, title: str, run_figure: Callable[[], dict[str, Any]], relay_pids: tuple[int, ...]
    ) -> dict[str, Any]:
        """Measure once; again (up to ``retries`` times, while time is left) if other work took the cores."""
        best: dict[str, Any] | None = None
        for attempt in range(1 + self.retries):
            busy = wait_for_quiet((self.server_cpu, self.client_cpu))
            noisy = f" (a core is still {busy:g}% busy with other work)" if busy >= NOISY_PERCENT else ""
            _progress(f"{title}{' again' if attempt else ''}{noisy}")
            server = CoreWatch(self.server_cpu, relay_pids)
            # Several gateway workers run on the clients' core too: their time there is not other work.
            shared = relay_pids if self.workers > 1 else ()
            client = CoreWatch(self.client_cpu, (self.stub_pid, os.getpid(), *shared), children=True)
            result = run_figure()
            result["foreign_cpu_pct"] = {"relay": server.foreign_percent(), "client": client.foreign_percent()}
            foreign = max(result["foreign_cpu_pct"].values())
            if best is None or foreign < max(best["foreign_cpu_pct"].values()):
                best = result
            if foreign <= NOISY_PERCENT or time.monotonic() > self.retry_until:
                break
        assert best is not None
        return best

    def _loadgen(
        self, workload: Workload, *, connections: int, rate: float = 0.0, stream: bool = False
    ) -> dict[str, Any]:
        command = [
            "taskset", "-c", str(self.client_cpu), sys.executable, "-m", "tests.bench.loadgen",
            "--port", str(workload.port), "--model", workload.model, "--connections", str(connections),
            "--seconds", str(self.seconds), "--warmup", str(WARMUP_S), "--rate", str(rate), "--json",
        ]  # fmt: skip
        if workload.api_key:
            command += ["--api-key", workload.api_key]
        if stream:
            command.append("--stream")
        timeout = WARMUP_S + self.seconds + 30
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"loadgen failed: {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def _wrk(self, name: str, workload: Workload, *, stream: bool, connections: int) -> dict[str, Any]:
        script = self.work_dir / f"{name}-{'stream' if stream else 'json'}.lua"
        script.write_text(workload.wrk_script(stream))
        options = {"connections": connections, "cpu": self.client_cpu}
        run_wrk(self.wrk, workload.url, script, seconds=WARMUP_S, **options)  # warm-up, discarded
        return asdict(run_wrk(self.wrk, workload.url, script, seconds=self.seconds, **options))


def measure_direct(bench: Bench, stub_port: int) -> dict[str, Any]:
    return bench.measure(targets.Target("direct", stub_port, targets.STUB_MODEL))


def measure_gateway(bench: Bench, stub_port: int, started: list[Service]) -> dict[str, Any]:
    port = free_port()
    config_path = bench.work_dir / "spillgate.yaml"
    argv = targets.gateway_argv(config_path, stub_port, port, bench.access_log)
    config = targets.gateway_config(stub_port, port, bench.access_log)
    if bench.workers > 1:
        argv += ["--workers", str(bench.workers)]
    elif bench.redis:
        config["state"] = {"redis_url": _start_redis(bench, started)}
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    gateway = start_pinned("spillgate", argv, cpu=bench.gateway_cpus, log_dir=bench.work_dir)
    started.append(gateway)
    try:
        ready = f"http://127.0.0.1:{port}/ready"
        wait_until(gateway, lambda: http_request(ready)[0] == 200, timeout=60, what="/ready answering 200")
        relay_pids = (gateway.pid, *_children(gateway.pid))  # the workers (and their Redis) when there are several
        row = bench.measure(targets.Target("spillgate", port, targets.ROUTE, targets.API_KEY), relay_pids)
        smoke.check_upstream_request(stub_port, targets.STUB_MODEL)
    finally:
        gateway.stop(timeout=60)  # each worker drains first
    row["command"] = " ".join(["taskset", "-c", bench.gateway_cpus, *argv])
    row["workers"] = bench.workers
    row["config"] = config
    return row


def _start_redis(bench: Bench, started: list[Service]) -> str:
    """A ``redis-server`` on a unix socket, as ``--workers N`` starts its own, on the clients' core: its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--redis needs redis-server installed")
    socket_path = str(bench.work_dir / "redis.sock")
    redis = start_pinned(
        "redis",
        private_redis_argv(binary, socket_path, str(bench.work_dir)),
        cpu=bench.client_cpu,
        log_dir=bench.work_dir,
    )
    started.append(redis)
    wait_until(redis, lambda: Path(socket_path).exists(), timeout=15, what="redis-server's socket")
    return f"unix://{socket_path}"


def measure_router(bench: Bench, stub_port: int, started: list[Service]) -> dict[str, Any]:
    python, note = router_env.router_python()
    if python is None:
        return {"skipped": note}
    _progress(note)
    port = free_port()
    argv = targets.router_argv(python, stub_port, port, free_port())
    router = start_pinned("sglang-router", argv, cpu=bench.server_cpu, log_dir=bench.work_dir)
    started.append(router)
    workload = Workload(port=port, model=targets.STUB_MODEL)
    try:

        def routes() -> bool:
            return http_request(workload.url, body=workload.body(False), headers=workload.headers())[0] == 200

        wait_until(router, routes, timeout=60, what="a chat completion answering 200")
        row = bench.measure(targets.Target("sglang-router", port, targets.STUB_MODEL), (router.pid,))
    finally:
        router.stop()
    row["command"] = " ".join(["taskset", "-c", str(bench.server_cpu), *argv])
    return row


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def added(row: dict[str, Any], direct: dict[str, Any]) -> dict[str, float]:
    """What a relay adds: its percentile minus the direct percentile, per figure."""
    pairs = {
        "p50_ms": ("latency", "p50_ms"),
        "p99_ms": ("latency", "p99_ms"),
        "ttfb_p50_ms": ("ttfb", "ttfb_p50_ms"),
        "ttfb_p99_ms": ("ttfb", "ttfb_p99_ms"),
    }
    return {name: round(row[run][key] - direct[run][key], 3) for name, (run, key) in pairs.items()}


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def _cores(server_cpu: int | None, client_cpu: int | None) -> tuple[int, int]:
    allowed = sorted(os.sched_getaffinity(0))
    server = allowed[0] if server_cpu is None else server_cpu
    client = next((c for c in allowed if c != server), server) if client_cpu is None else client_cpu
    if server == client:
        _progress(f"warning: only core {server} is available: relay and clients share it, figures are not comparable")
    return server, client


def measure_all(bench: Bench, skip_router: bool) -> tuple[dict[str, dict[str, Any]], bool]:
    """Every row, and whether one failed; whatever was started is stopped by PID before this returns."""
    rows: dict[str, dict[str, Any]] = {}
    started: list[Service] = []
    failed = False
    try:
        stub_port = free_port()
        stub = start_pinned("stub", targets.stub_argv(stub_port), cpu=bench.client_cpu, log_dir=bench.work_dir)
        started.append(stub)
        bench.stub_pid = stub.pid
        health = f"http://127.0.0.1:{stub_port}/health"
        wait_until(stub, lambda: http_request(health)[0] == 200, timeout=15, what="/health answering 200")
        _progress(f"stub on core {bench.client_cpu}, relays on core {bench.server_cpu}; {bench.seconds:g} s per figure")
        rows["direct"] = measure_direct(bench, stub_port)
        for name, measure in (("spillgate", measure_gateway), ("sglang-router", measure_router)):
            if name == "sglang-router" and skip_router:
                rows[name] = {"skipped": "--skip-router"}
                continue
            try:
                rows[name] = measure(bench, stub_port, started)
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
                failed = True
                _progress(f"{name} failed: {exc}")
                rows[name] = {"skipped": f"failed: {str(exc).splitlines()[0]}"}
    finally:
        for service in reversed(started):
            service.stop()
        if sys.exc_info()[0] is not None:
            print(f"logs kept in {bench.work_dir}", file=sys.stderr)
    for row in rows.values():
        if row is not rows["direct"] and "skipped" not in row:
            row["added"] = added(row, rows["direct"])
    return rows, failed


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if shutil.which("taskset") is None:
        print("taskset (util-linux) is required to pin processes to cores", file=sys.stderr)
        return 2
    try:
        wrk = ensure_wrk()
    except WrkMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    server_cpu, client_cpu = _cores(args.server_cpu, args.client_cpu)
    machine = report.machine_info()
    os.sched_setaffinity(0, {client_cpu})  # this process's own work stays off the relay's core
    load_before = report.load_average()
    work_dir = Path(tempfile.mkdtemp(prefix="spillgate-bench-"))
    bench = Bench(args.seconds, client_cpu, server_cpu, wrk, work_dir, retries=args.retries, access_log=args.access_log)
    bench.workers = args.workers
    bench.redis = args.redis
    bench.retry_until = time.monotonic() + RETRY_BUDGET_FIGURES * (args.seconds + 2 * WARMUP_S)
    rows, failed = measure_all(bench, args.skip_router)
    settings = {
        "seconds": args.seconds,
        "warmup_s": WARMUP_S,
        "access_log": args.access_log,
        "server_cpu": server_cpu,
        "client_cpu": client_cpu,
        "paced_rate": PACED_RATE,
        "router_version": router_env.ROUTER_VERSION,
        "workers": args.workers,
        "redis": args.redis or args.workers > 1,
        "spillgate_cpus": bench.gateway_cpus,
    }
    loads = {"before": load_before, "after": report.load_average()}
    print(report.render(machine, loads, settings, rows))
    if args.workers > 1:
        print(
            f"\nspillgate ran {args.workers} worker processes on cores {bench.gateway_cpus} (shared with the clients)"
        )
    if failed:
        print(f"\nlogs kept in {work_dir}")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(machine, loads, settings, rows), indent=2) + "\n")
    gateway = rows.get("spillgate", {})
    if failed or (args.check and ("added" not in gateway or not all(report.goals_met(gateway).values()))):
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per figure (default 5)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON to FILE")
    parser.add_argument("--skip-router", action="store_true", help="leave out the sglang-router row")
    parser.add_argument(
        "--access-log", choices=["json", "logfmt", "off"], default="json", help="the relay's access log (default json)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when spillgate misses a goal")
    parser.add_argument(
        "--retries", type=int, default=1, help="re-measure a figure this often when other work took the cores"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="spillgate serve --workers N; more than one may use the clients' core too (default 1)",
    )
    parser.add_argument(
        "--redis", action="store_true", help="one worker shares its state through a Redis, as several do"
    )
    parser.add_argument("--server-cpu", type=int, default=None, help="core for the relay (default: first allowed)")
    parser.add_argument("--client-cpu", type=int, default=None, help="core for stub and clients (default: next)")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted: every server started was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
