"""``spillgate bench``: load any OpenAI-compatible URL with a workload and print (and save) the figures.

Ctrl-C stops the run and still prints what was measured; a second Ctrl-C aborts at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

import orjson

from spillgate.gateway.bench.api import BenchError, BenchResult, run_bench
from spillgate.gateway.bench.arrivals import BURST, burst_spec
from spillgate.gateway.bench.config import (
    GROUP_DISTRIBUTIONS,
    SESSION_ORDERS,
    AgentKnobs,
    BenchConfig,
    ChatKnobs,
    GspKnobs,
)
from spillgate.gateway.bench.progress import Progress
from spillgate.gateway.bench.report import format_table, to_json

EXAMPLES = """examples:
  spillgate bench --url http://127.0.0.1:8080 --api-key sk-spillgate-demo --model llama-3.1-8b \\
      --workload gsp --rate 8 --num-requests 200
  spillgate bench --url http://127.0.0.1:30000 --workload chat --concurrency 1,4,16 --duration 60 --json out.json
  spillgate bench --url http://127.0.0.1:8080 --workload trace:mooncake.jsonl --trace-speedup 4 --duration 120
  spillgate bench --url http://127.0.0.1:8080 --api-key sk-spillgate-demo --model auto --workload gsp \
      --rate-schedule burst --capacity-rps 8 --burst-seconds 60 --steady-seconds 120
  spillgate bench --url http://127.0.0.1:8080 --workload gsp --rate-schedule 2:30,10:30,0:10,2:30
"""


def _levels(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("a concurrency or a comma list of them, e.g. 1,4,16") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be at least 1")
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--url",
        required=True,
        action="append",
        help="base URL of the OpenAI-compatible server (with or without /v1); give it again for each process of a "
        "server run as several (requests rotate over them, as a load balancer without affinity would)",
    )
    parser.add_argument("--api-key", default=None, help="sent as 'authorization: Bearer KEY'")
    parser.add_argument("--model", default=None, help="the request's model (default: the first of GET /v1/models)")
    parser.add_argument("--workload", required=True, metavar="{gsp,chat,agent,trace:PATH}")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--rate", type=float, default=None, help="open loop: Poisson arrivals, requests/s")
    shape.add_argument(
        "--concurrency", type=_levels, default=(), help="closed loop: N requests in flight; a comma list is a sweep"
    )
    shape.add_argument(
        "--rate-schedule",
        default=None,
        metavar="SPEC",
        help="open loop, Poisson at a rate that steps: RATE:SECONDS,... with RATE in requests/s or Nx times "
        "--capacity-rps (e.g. 0.6x:60,3x:60,0.6x:60); 'burst' is 0.6x for --steady-seconds, 3x for "
        "--burst-seconds, 0.6x again. The report adds a row per phase",
    )
    parser.add_argument("--capacity-rps", type=float, default=None, help="what 1x means in --rate-schedule, requests/s")
    parser.add_argument("--burst-seconds", type=float, default=60.0, help="the 3x phase of --rate-schedule burst")
    parser.add_argument("--steady-seconds", type=float, default=60.0, help="each 0.6x phase of --rate-schedule burst")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load per level")
    parser.add_argument("--num-requests", type=int, default=None, help="requests per level")
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="requests sent in each level's first SECONDS load the server but are not counted (steady state)",
    )
    parser.add_argument(
        "--session-order",
        choices=SESSION_ORDERS,
        default="random",
        help="chat/agent: the ready session that sends next (random: SGLang's multi-turn default; fifo)",
    )
    parser.add_argument("--trace-speedup", type=float, default=1.0, help="divide trace timestamps by this")
    parser.add_argument(
        "--trace-block-tokens",
        type=int,
        default=512,
        help="tokens per trace block (Mooncake's are 512): smaller shrinks every prompt alike, sharing kept",
    )
    parser.add_argument("--trace-max-output-tokens", type=int, default=None, help="cap each record's output")
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=50.0)
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds prompt text and arrivals; a rerun with the same seed finds its prompts cached on the server",
    )
    parser.add_argument("--request-timeout", type=float, default=300.0, help="seconds one request may take")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (also off when not a TTY)")

    gsp = parser.add_argument_group("gsp workload (SGLang's generated-shared-prefix benchmark)")
    gsp.add_argument("--gsp-groups", type=int, default=GspKnobs.groups)
    gsp.add_argument("--gsp-prompts-per-group", type=int, default=GspKnobs.prompts_per_group)
    gsp.add_argument("--gsp-system-tokens", type=int, default=GspKnobs.system_tokens)
    gsp.add_argument("--gsp-question-tokens", type=int, default=GspKnobs.question_tokens)
    gsp.add_argument("--gsp-output-tokens", type=int, default=GspKnobs.output_tokens)
    gsp.add_argument(
        "--gsp-group-distribution",
        choices=GROUP_DISTRIBUTIONS,
        default=GspKnobs.group_distribution,
        help="uniform: prompts-per-group requests per group; zipf: each request's group drawn with probability "
        "1/rank**alpha (rank starts at 1, group 0 hottest), the same number of requests in all",
    )
    gsp.add_argument(
        "--gsp-zipf-alpha", type=float, default=GspKnobs.zipf_alpha, help="zipf's alpha, a finite float > 0"
    )
    chat = parser.add_argument_group("chat workload (multi-turn sessions)")
    chat.add_argument(
        "--chat-sessions", type=int, default=ChatKnobs.sessions, help="live sessions (at least the concurrency)"
    )
    chat.add_argument("--chat-turns", type=int, default=ChatKnobs.turns)
    chat.add_argument("--chat-user-tokens", type=int, default=ChatKnobs.user_tokens)
    chat.add_argument("--chat-output-tokens", type=int, default=ChatKnobs.output_tokens)
    agent = parser.add_argument_group("agent workload (shared tool-definition prefix, short steps)")
    agent.add_argument(
        "--agent-sessions", type=int, default=AgentKnobs.sessions, help="live sessions (at least the concurrency)"
    )
    agent.add_argument("--agent-steps", type=int, default=AgentKnobs.steps)
    agent.add_argument("--agent-tool-tokens", type=int, default=AgentKnobs.tool_tokens)
    agent.add_argument("--agent-step-tokens", type=int, default=AgentKnobs.step_tokens)
    agent.add_argument("--agent-output-tokens", type=int, default=AgentKnobs.output_tokens)
    parser.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    schedule = args.rate_schedule
    if schedule is not None and schedule.strip() == BURST:
        # Written out in the config (and the JSON report), so a run says exactly what it sent.
        schedule = burst_spec(args.burst_seconds, args.steady_seconds)
    return BenchConfig(
        url=args.url[0],
        more_urls=tuple(args.url[1:]),
        workload=args.workload,
        api_key=args.api_key,
        model=args.model,
        rate=args.rate,
        rate_schedule=schedule,
        capacity_rps=args.capacity_rps,
        concurrency=tuple(args.concurrency),
        duration_s=args.duration,
        num_requests=args.num_requests,
        warmup_s=args.warmup,
        session_order=args.session_order,
        trace_speedup=args.trace_speedup,
        trace_block_tokens=args.trace_block_tokens,
        trace_max_output_tokens=args.trace_max_output_tokens,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        gsp=GspKnobs(
            groups=args.gsp_groups,
            prompts_per_group=args.gsp_prompts_per_group,
            system_tokens=args.gsp_system_tokens,
            question_tokens=args.gsp_question_tokens,
            output_tokens=args.gsp_output_tokens,
            group_distribution=args.gsp_group_distribution,
            zipf_alpha=args.gsp_zipf_alpha,
        ),
        chat=ChatKnobs(
            sessions=args.chat_sessions,
            turns=args.chat_turns,
            user_tokens=args.chat_user_tokens,
            output_tokens=args.chat_output_tokens,
        ),
        agent=AgentKnobs(
            sessions=args.agent_sessions,
            steps=args.agent_steps,
            tool_tokens=args.agent_tool_tokens,
            step_tokens=args.agent_step_tokens,
            output_tokens=args.agent_output_tokens,
        ),
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        # Checked before the run: its figures must not be lost at the end.
        print(f"spillgate bench: --json {args.json}: not a file in an existing directory", file=sys.stderr)
        return 2
    progress = None if args.no_progress or not sys.stderr.isatty() else Progress(sys.stderr)
    try:
        result = _run(config, progress)
    except BenchError as exc:
        print(f"spillgate bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spillgate bench: aborted", file=sys.stderr)
        return 130
    print(format_table(result))
    if args.json is not None:
        try:
            args.json.write_bytes(orjson.dumps(to_json(result), option=orjson.OPT_INDENT_2) + b"\n")
        except OSError as exc:
            print(f"spillgate bench: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if result.interrupted:
        return 130
    if all(level.summary.completed == 0 for level in result.levels):
        print("spillgate bench: no request succeeded (see the errors above)", file=sys.stderr)
        return 1
    return 0


def _run(config: BenchConfig, progress: Progress | None) -> BenchResult:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        runner = asyncio.Runner()
    with runner:
        return runner.run(_with_signals(config, progress))


async def _with_signals(config: BenchConfig, progress: Progress | None) -> BenchResult:
    """Run with the first SIGINT or SIGTERM turned into a clean stop; a second SIGINT aborts."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def request_stop(signum: int) -> None:
        if not stop.is_set():
            print("\nspillgate bench: stopping (Ctrl-C again to abort)", file=sys.stderr)
            stop.set()
        loop.remove_signal_handler(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, request_stop, signum)
    try:
        return await run_bench(config, stop=stop, progress=progress)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(signum)
