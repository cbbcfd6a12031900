"""``spillgate serve``: load the config, bind the port, start the embedded simulators it asks for, run the gateway
in this process or in ``--workers N`` processes (:mod:`gateway.workers`)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from spillgate.gateway.control.config import (
    DEMO_CONFIG_PATH,
    ConfigError,
    GatewayConfig,
    PoolConfig,
    SimulatedReplicas,
    parse_config,
    read_raw,
)
from spillgate.gateway.control.data_dir import data_directory
from spillgate.gateway.control.plugins import PluginError, load_plugins
from spillgate.gateway.control.secrets import MissingSecret, resolve_secret
from spillgate.gateway.supervisor import CannotListen, ChildProcesses, PrivateRedis, free_port, listening_socket
from spillgate.gateway.workers import Workers, WorkerSpec, with_redis

if TYPE_CHECKING:
    from spillgate.gateway.state import GatewayState

# The gateway itself (its app, state, uvicorn, litellm) is imported by the functions that serve: the parent of
# --workers N needs none of it, and importing it takes seconds of the CPU the starting workers need.

_SHUTDOWN_AFTER_DRAIN_S = 5
"""uvicorn's own graceful shutdown, once the drain is over: for requests other than completions (a slow
``/admin`` call) still running then."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help=f"YAML config (default: {DEMO_CONFIG_PATH})")
    parser.add_argument("--host", default=None, help="listen address (overrides listen.host)")
    parser.add_argument("--port", type=listen_port, default=None, help="listen port (overrides listen.port)")
    parser.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="gateway processes on the one port (default 1); more than one share their state through Redis: "
        "state.redis_url, else a private redis-server this command starts",
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so the config may name the policies and engines it registers (repeatable)",
    )
    parser.add_argument("--worker-of", default=None, help=argparse.SUPPRESS)  # set by the parent of --workers N
    parser.set_defaults(handler=run)


def listen_port(text: str) -> int:
    """A TCP port from 1 to 65535, for argparse: an out-of-range one must not quietly become another."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 1 to 65535, got {port}")
    return port


def worker_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of processes: {text!r}") from None
    if not 1 <= count <= 256:
        raise argparse.ArgumentTypeError(f"--workers is from 1 to 256, got {count}")
    return count


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health probe is noise
    path = args.config or DEMO_CONFIG_PATH
    try:
        load_plugins(args.plugin)
    except PluginError as exc:
        print(f"spillgate: {exc}", file=sys.stderr)
        return 2
    try:
        raw = read_raw(path)
        config = parse_config(raw, source=str(path))
    except ConfigError as exc:
        print(f"spillgate: invalid config\n{exc}", file=sys.stderr)
        return 2
    assert isinstance(raw, dict)
    # uvicorn re-raises a signal that stopped it before it served; make SIGTERM end in an exception like SIGINT
    # does, so what this process started is stopped rather than orphaned.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if args.worker_of is not None:
        return _run_worker(args, config, raw, path, WorkerSpec.from_arg(args.worker_of))
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port
    redis_problem = _redis_problem(config, args.workers)
    if redis_problem:
        print(f"spillgate: {redis_problem}", file=sys.stderr)
        return 2
    try:
        listener = listening_socket(host, port)  # before anything starts: a busy port must cost nothing
    except CannotListen as exc:
        print(f"spillgate: {exc}", file=sys.stderr)
        return 2
    with listener:
        if args.workers == 1:
            return _serve_alone(args, config, raw, path, listener)
        return _serve_workers(args, config, path, listener)


def _serve_alone(
    args: argparse.Namespace, config: GatewayConfig, raw: dict[str, object], path: Path, listener: socket.socket
) -> int:
    host, port = listener.getsockname()[:2]
    children = ChildProcesses()
    try:
        # The state is built while the simulators start: a mistake it finds stops them before they are up.
        replica_urls, hosted_urls = _start_simulators(config, children, wait=False)
        state = _build(config, raw, path, replica_urls, hosted_urls)
        if state is None:
            return 2
        children.wait_ready(children.readiness)
        _print_banner(config, path, host, port, replica_urls, hosted_urls, state.data_dir)
        return _serve(args, state, listener)
    finally:
        children.stop_all()


def _serve_workers(args: argparse.Namespace, config: GatewayConfig, path: Path, listener: socket.socket) -> int:
    host, port = listener.getsockname()[:2]
    children = ChildProcesses()
    redis = PrivateRedis()
    workers: Workers | None = None
    try:
        redis_url = None if config.state.redis_url else redis.start()
        replica_urls, hosted_urls = _start_simulators(config, children, wait=False)  # they start as the workers do
        command = [sys.executable, "-m", "spillgate.gateway.cli", "serve", "--config", str(path)]
        command += ["--log-level", args.log_level, *(f"--plugin={name}" for name in args.plugin)]
        workers = Workers(
            args.workers,
            listener,
            command,
            replica_urls=replica_urls,
            hosted_urls=hosted_urls,
            redis_url=redis_url,
        )
        workers.catch_signals()
        workers.spawn()
        children.wait_ready(children.readiness)
        failed = workers.wait_serving()
        if failed is not None:
            return failed
        data_dir = data_directory(config.state, path)
        _print_banner(config, path, host, port, replica_urls, hosted_urls, data_dir)
        shared = "a private redis-server at " + redis_url if redis_url else "state.redis_url"
        print(f"  workers: {args.workers} (pids {', '.join(map(str, workers.pids))}), sharing {shared}", flush=True)
        return workers.supervise(config.timeouts.drain_s)
    finally:
        if workers is not None:
            workers.stop(drain_s=0)  # nothing left to stop after supervise; on an error, what was started
        children.stop_all()
        redis.stop()


def _run_worker(
    args: argparse.Namespace, config: GatewayConfig, raw: dict[str, object], path: Path, spec: WorkerSpec
) -> int:
    """One of ``--workers N``: the parent's socket, simulators and Redis; no banner (the parent prints it)."""
    listener = socket.socket(fileno=spec.socket_fd)
    state = _build(config, raw, path, spec.replica_urls, spec.hosted_urls)
    if state is None:
        return 2
    if spec.redis_url is not None:
        state.config = with_redis(state.config, spec.redis_url)  # after LiveConfig took the file's settings
    return _serve(args, state, listener, ready_fd=spec.ready_fd)


def _build(
    config: GatewayConfig,
    raw: dict[str, object],
    path: Path,
    replica_urls: dict[str, list[str]],
    hosted_urls: dict[str, str],
) -> GatewayState | None:
    from spillgate.gateway.control.live_config import LiveConfig
    from spillgate.gateway.state import build_state

    try:
        state = build_state(config, replica_urls, hosted_urls, config_path=path)
        state.live = LiveConfig(state, raw, path=path)
    except (MissingSecret, ConfigError) as exc:
        print(f"spillgate: invalid config\n{path}: {exc}", file=sys.stderr)
        return None
    return state


def _serve(args: argparse.Namespace, state: GatewayState, listener: socket.socket, ready_fd: int | None = None) -> int:
    """Serve on ``listener`` until stopped; a stop signal drains first (:mod:`gateway.lifecycle`)."""
    import uvicorn

    from spillgate.gateway.app import GatewayApp
    from spillgate.gateway.lifecycle import GatewayServer
    from spillgate.gateway.observability.tracing import Tracing
    from spillgate.gateway.serving.connections import guarded_protocol

    config = state.config
    # Everything built so far lives as long as the process: keep it out of every GC pass.
    gc.freeze()
    tracing = Tracing.from_environment()
    if tracing.on and ready_fd is None:
        print("  traces: OpenTelemetry, as the OTEL_* environment variables say", flush=True)
    app = GatewayApp(state, tracing=tracing)
    server = GatewayServer(
        uvicorn.Config(
            app,
            loop="uvloop",
            http=guarded_protocol(
                config.timeouts.client_headers_s, config.limits.max_connections_per_client, app.connection_refused
            ),
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=_SHUTDOWN_AFTER_DRAIN_S,
            timeout_keep_alive=config.timeouts.keep_alive_s,
        ),
        app.drain,
        config.timeouts.drain_s,
        ready_fd=ready_fd,
    )
    with contextlib.suppress(KeyboardInterrupt, SystemExit):
        server.run(sockets=[listener])
    tracing.shutdown()
    return 0 if server.started else 1


def _redis_problem(config: GatewayConfig, workers: int) -> str:
    """Why ``workers`` processes cannot share their state, or ``""``."""
    if workers == 1:
        return ""
    if config.state.redis_url:
        try:
            resolve_secret(config.state.redis_url)
        except MissingSecret as exc:
            return f"--workers {workers} shares state through state.redis_url, but its {exc}"
        return ""
    if PrivateRedis.available():
        return ""
    return (
        f"--workers {workers} shares budgets, rate limits and config through Redis: set state.redis_url in the "
        "config (e.g. os.environ/REDIS_URL), or install redis-server for a private one"
    )


def _kv_event_flags(sim: SimulatedReplicas) -> list[str]:
    """A simulated replica's ``--kv-events-config`` on free ports, in its engine's form (SGLang binds when told to;
    vLLM binds on ``*``)."""
    if not sim.kv_events or "--kv-events-config" in sim.extra_args:
        return []
    port, replay = free_port(), free_port()
    if "vllm" in sim.extra_args:
        config: dict[str, object] = {
            "enable_kv_cache_events": True,
            "endpoint": f"tcp://*:{port}",
            "replay_endpoint": f"tcp://*:{replay}",
        }
    else:
        endpoint, replay_endpoint = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"
        config = {"publisher": "zmq", "endpoint": endpoint, "bind": True, "replay_endpoint": replay_endpoint}
    return ["--kv-events-config", json.dumps(config)]


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _start_simulators(
    config: GatewayConfig, children: ChildProcesses, *, wait: bool = True
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Start the config's simulators; with ``wait``, return once each answers (else ``children.wait_ready``)."""
    replica_urls: dict[str, list[str]] = {}
    """Addresses of the simulated replicas, by pool (a pool's configured ``replicas`` come first)."""
    for pool in config.pools:
        if pool.simulated is not None:
            sim = pool.simulated
            args = ["--preset", sim.preset, "--time-scale", str(sim.time_scale), "--model-name", pool.served_model]
            replica_urls[pool.name] = [
                children.start("sim-replica", [*args, *sim.extra_args, *_kv_event_flags(sim)]) for _ in range(sim.count)
            ]
    hosted_urls: dict[str, str] = {}
    """API bases of the simulated hosted models (real ones use their configured ``api_base``)."""
    started: list[str] = []
    for hosted in config.hosted_models:
        if hosted.simulated is None:
            continue
        sim = hosted.simulated
        url = children.start(
            "sim-hosted",
            [
                "--model-name",
                hosted.model.split("/", 1)[-1],
                "--ttft-ms",
                str(sim.ttft_ms),
                "--tpot-ms",
                str(sim.tpot_ms),
                "--time-scale",
                str(sim.time_scale),
            ],
        )
        started.append(url)
        # litellm appends /chat/completions to an OpenAI-style base and /v1/messages to Anthropic's.
        hosted_urls[hosted.name] = url if hosted.model.startswith("anthropic/") else url + "/v1"
    # A simulated replica answers /ready at once, as SGLang does; its /health runs a generation.
    children.readiness = [u + "/ready" for urls in replica_urls.values() for u in urls] + [
        u + "/health" for u in started
    ]
    if wait:
        children.wait_ready(children.readiness)
    return replica_urls, hosted_urls


def _pool_replicas(pool: PoolConfig, simulated_urls: list[str]) -> str:
    """Each replica by the name that metrics, logs and the admin API use, with its address; then discovery."""
    named = zip(pool.replica_names(), (r.url for r in pool.replicas), strict=True)
    shown = [f"{name} ({url})" for name, url in (*named, *zip(pool.simulated_names(), simulated_urls, strict=False))]
    if pool.discovery is not None:
        found = pool.discovery.kubernetes
        shown.append(f"pods matching {found.label_selector!r} in namespace {found.namespace or '(its own)'}")
    return ", ".join(shown) or "none"


def _print_banner(
    config: GatewayConfig,
    path: Path,
    host: str,
    port: int,
    replica_urls: dict[str, list[str]],
    hosted_urls: dict[str, str],
    data_dir: Path,
) -> None:
    url = f"http://{host}:{port}"
    lines = [
        f"spillgate serving {url}  (config: {path})",
        f"  OpenAI base URL: {url}/v1",
        f"  dashboard:       {url}/dashboard   metrics: {url}/metrics",
        f"  data directory:  {data_dir}   (ledger, config history; state.data_dir)",
    ]
    for pool in config.pools:
        lines.append(f"  pool {pool.name}: {_pool_replicas(pool, replica_urls.get(pool.name, []))}")
    for hosted in config.hosted_models:
        where = hosted_urls.get(hosted.name) or hosted.api_base or "provider default"
        lines.append(f"  hosted {hosted.name}: {hosted.model} at {where}")
    routes = ", ".join(r.name for r in config.routes)
    lines.append(f"  routes (use as 'model'): {routes}")
    if path == DEMO_CONFIG_PATH:  # the demo's keys are public; a real config's are never printed
        for tenant in config.tenants:
            lines.append(f"  tenant {tenant.name}: key {tenant.keys[0]}")
        lines += [f"  admin key: {key}" for key in config.admin.keys[:1]]
    print("\n".join(lines), flush=True)
