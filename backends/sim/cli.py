"""``spillgate sim-replica`` and ``spillgate sim-hosted``: argument parsing and the uvicorn runner."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from spillgate.backends.sim.config import ReplicaConfig
from spillgate.backends.sim.hosted import HostedConfig, create_hosted_app
from spillgate.backends.sim.presets import PRESETS
from spillgate.backends.sim.server import create_app

GRACEFUL_SHUTDOWN_S = 3
VLLM_BLOCK_SIZE = 16
"""vLLM's KV block on a GPU: prefix caching and ``cached_tokens`` go by whole blocks."""


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--preset", default="llama-3.1-8b-h100", choices=sorted(PRESETS))
    parser.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="multiply simulated durations by this (0.01 runs 100x faster than real time)",
    )
    parser.add_argument("--model-name", default=None, help="served model name (default: the preset's model)")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="cap the KV pool, in tokens")
    parser.add_argument("--page-size", "--block-size", type=int, default=None, help="default 1 (SGLang), 16 (vLLM)")
    parser.add_argument(
        "--chunked-prefill-size", "--max-num-batched-tokens", type=int, default=None, help="-1 disables chunking"
    )
    parser.add_argument("--max-running-requests", "--max-num-seqs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dp-size",
        "--data-parallel-size",
        type=_positive_int,
        default=1,
        help="data-parallel ranks: schedulers each with their own KV cache and KV-event publisher (port + rank)",
    )
    parser.add_argument(
        "--engine", default="sglang", choices=["sglang", "vllm"], help="whose server to look like (default sglang)"
    )
    parser.add_argument("--context-length", "--max-model-len", type=int, default=None, help="shorter than the model's")
    # SGLang's switches, off by default as in SGLang (see backends/sim/CONTRACT.md).
    parser.add_argument("--enable-metrics", action="store_true", help="serve /metrics (404 without)")
    parser.add_argument(
        "--enable-cache-report",
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details (SGLang's and vLLM's names)",
    )
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (not on /health, /metrics)"
    )
    parser.add_argument("--disable-overlap-schedule", action="store_true")
    parser.add_argument("--schedule-policy", default="fcfs", choices=["fcfs", "lpm", "random", "dfs-weight", "lof"])
    parser.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help='publish KV-cache events over ZMQ, as the engine does (SGLang: \'{"publisher": "zmq", "endpoint": '
        '"tcp://*:5557", "topic": "kv"}\'; vLLM: \'{"enable_kv_cache_events": true, ...}\')',
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="parse forced tool calls into tool_calls (both engines need one: SGLang llama3, vLLM llama3_json)",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="vLLM: parse tool calls (with --tool-call-parser); without both it refuses tool_choice",
    )
    parser.add_argument(
        "--enable-response-store",
        action="store_true",
        help="SGLang: keep /v1/responses answers for previous_response_id and retrieval (vLLM: the environment "
        "variable VLLM_ENABLE_RESPONSES_API_STORE=1)",
    )
    parser.set_defaults(handler=run_replica)


def add_hosted_arguments(parser: argparse.ArgumentParser) -> None:
    from spillgate.backends.sim.hosted_faults import add_fault_arguments

    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-name", default="frontier-large")
    parser.add_argument("--ttft-ms", type=float, default=350.0)
    parser.add_argument("--tpot-ms", type=float, default=12.0)
    parser.add_argument("--jitter", type=float, default=0.1, help="relative spread of TTFT and TPOT, in [0, 1)")
    parser.add_argument("--time-scale", type=_positive_float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prompt-cache-min-tokens",
        type=int,
        default=1024,
        help="report repeated prefixes of prompts this long as cached, in 128-token blocks (0: never)",
    )
    parser.add_argument("--api-key", default=None, help="accept only this key, as a provider does (default: any)")
    add_fault_arguments(parser)
    parser.set_defaults(handler=run_hosted)


def replica_config_from_args(args: argparse.Namespace) -> ReplicaConfig:
    """The replica's config; ValueError naming the flag if ``--kv-events-config`` is not one the engine takes."""
    config = ReplicaConfig(
        preset=args.preset,
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        model_name=args.model_name,
        max_total_tokens=args.max_total_tokens,
        page_size=args.page_size or (VLLM_BLOCK_SIZE if args.engine == "vllm" else 1),
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        seed=args.seed,
        context_length_override=args.context_length,
        enable_metrics=args.enable_metrics,
        enable_cache_report=args.enable_cache_report,
        api_key=args.api_key,
        disable_overlap_schedule=args.disable_overlap_schedule,
        schedule_policy=args.schedule_policy,
        engine=args.engine,
        kv_events_config=args.kv_events_config,
        tool_call_parser=args.tool_call_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        enable_response_store=args.enable_response_store,
        dp_size=args.dp_size,
    )
    try:
        config.kv_events  # noqa: B018 - parsed now, so a bad flag stops the start
    except ValueError as exc:
        raise ValueError(f"--kv-events-config: {exc}") from None
    return config


def hosted_config_from_args(args: argparse.Namespace) -> HostedConfig:
    return HostedConfig(
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        jitter=args.jitter,
        time_scale=args.time_scale,
        seed=args.seed,
        api_key=args.api_key,
    )


class _Server(uvicorn.Server):
    """Stops generation first on shutdown, so open streams end instead of holding the exit up."""

    def __init__(self, config: uvicorn.Config, stop_generation: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._stop_generation = stop_generation

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._stop_generation is not None:
            self._stop_generation()
        await super().shutdown(sockets)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve(app: FastAPI, host: str, port: int) -> int:
    """Run ``app`` until SIGTERM or SIGINT, then shut down gracefully and exit with status 0.

    uvicorn re-raises the signal after its graceful shutdown; the handler installed here turns
    that (or a signal during startup) into a normal exit instead of death by signal.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    _Server(config, getattr(app.state, "stop_generation", None)).run()
    return 0


def run_replica(args: argparse.Namespace) -> int:
    try:
        config = replica_config_from_args(args)
    except ValueError as exc:
        print(f"spillgate sim-replica: error: {exc}", file=sys.stderr)
        return 2
    return serve(create_app(config), config.host, config.port)


def run_hosted(args: argparse.Namespace) -> int:
    import dataclasses

    from spillgate.backends.sim.hosted_faults import faults_from_args

    config = dataclasses.replace(
        hosted_config_from_args(args),
        prompt_cache_min_tokens=args.prompt_cache_min_tokens,
        faults=faults_from_args(args),
    )
    return serve(create_hosted_app(config), config.host, config.port)
