"""``spillgate serve``: load the config, start the embedded simulators it asks for, run the gateway."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import signal
import sys
from pathlib import Path

import uvicorn

from spillgate.gateway.app import GatewayApp
from spillgate.gateway.control.config import (
    DEMO_CONFIG_PATH,
    ConfigError,
    GatewayConfig,
    SimulatedReplicas,
    parse_config,
    read_raw,
)
from spillgate.gateway.control.live_config import LiveConfig
from spillgate.gateway.control.plugins import PluginError, load_plugins
from spillgate.gateway.control.secrets import MissingSecret
from spillgate.gateway.observability.tracing import Tracing
from spillgate.gateway.serving.connections import guarded_protocol
from spillgate.gateway.state import build_state
from spillgate.gateway.supervisor import ChildProcesses, free_port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help=f"YAML config (default: {DEMO_CONFIG_PATH})")
    parser.add_argument("--host", default=None, help="listen address (overrides listen.host)")
    parser.add_argument("--port", type=listen_port, default=None, help="listen port (overrides listen.port)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so the config may name the policies and engines it registers (repeatable)",
    )
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
    host = args.host or config.listen.host
    port = config.listen.port if args.port is None else args.port

    children = ChildProcesses()
    try:
        replica_urls, hosted_urls = _start_simulators(config, children)
        try:
            state = build_state(config, replica_urls, hosted_urls, config_path=path)
            assert isinstance(raw, dict)
            state.live = LiveConfig(state, raw, path=path)
        except (MissingSecret, ConfigError) as exc:
            print(f"spillgate: invalid config\n{path}: {exc}", file=sys.stderr)
            return 2
        _print_banner(config, path, host, port, replica_urls, hosted_urls)
        # Everything built so far lives as long as the process: keep it out of every GC pass.
        gc.freeze()
        tracing = Tracing.from_environment()
        if tracing.on:
            print("  traces: OpenTelemetry, as the OTEL_* environment variables say", flush=True)
        app = GatewayApp(state, tracing=tracing)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                loop="uvloop",
                http=guarded_protocol(
                    config.timeouts.client_headers_s, config.limits.max_connections_per_client, app.connection_refused
                ),
                log_level=args.log_level,
                access_log=False,
                timeout_graceful_shutdown=5,
                timeout_keep_alive=config.timeouts.keep_alive_s,
            )
        )
        # uvicorn re-raises the signal that stopped it once it has shut down; make SIGTERM end in an
        # exception like SIGINT does, so the simulators below are stopped rather than orphaned.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        with contextlib.suppress(KeyboardInterrupt, SystemExit):
            server.run()
        tracing.shutdown()
        return 0 if server.started else 1
    finally:
        children.stop_all()


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


def _start_simulators(config: GatewayConfig, children: ChildProcesses) -> tuple[dict[str, list[str]], dict[str, str]]:
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
    children.wait_ready(
        [u + "/ready" for urls in replica_urls.values() for u in urls] + [u + "/health" for u in started]
    )
    return replica_urls, hosted_urls


def _print_banner(
    config: GatewayConfig,
    path: Path,
    host: str,
    port: int,
    replica_urls: dict[str, list[str]],
    hosted_urls: dict[str, str],
) -> None:
    url = f"http://{host}:{port}"
    lines = [
        f"spillgate serving {url}  (config: {path})",
        f"  OpenAI base URL: {url}/v1",
        f"  dashboard:       {url}/dashboard   metrics: {url}/metrics",
    ]
    for pool in config.pools:
        lines.append(f"  pool {pool.name}: {', '.join([*pool.replicas, *replica_urls.get(pool.name, [])])}")
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
