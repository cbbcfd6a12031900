"""The ``spillgate`` command: ``serve``, ``bench``, ``plan``, ``complexity``, ``sim-replica``, ``sim-hosted``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spillgate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    from spillgate.backends.sim import cli as sim_cli
    from spillgate.backends.sim import prompt_encoder  # noqa: F401  (prefix.tokenizer: simulated)
    from spillgate.gateway import complexity_cli, plan, serve
    from spillgate.gateway.bench import cli as bench_cli

    serve.add_arguments(commands.add_parser("serve", help="run the gateway (default: the embedded demo)"))
    bench_cli.add_arguments(
        commands.add_parser("bench", help="load an OpenAI-compatible URL with a workload and report latencies")
    )
    plan.add_arguments(
        commands.add_parser("plan", help="estimate replicas, GPUs and cost per day from a measured operating point")
    )

    complexity_cli.add_arguments(
        commands.add_parser("complexity", help="train, judge and size the complexity score on routing evidence")
    )

    sim_cli.add_replica_arguments(
        commands.add_parser("sim-replica", help="run a simulated SGLang replica (no GPU needed)")
    )
    sim_cli.add_hosted_arguments(
        commands.add_parser("sim-hosted", help="run a simulated hosted OpenAI-compatible model")
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
