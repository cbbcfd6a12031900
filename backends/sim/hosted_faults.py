"""Failure injection for the hosted-model simulator, so tests can make a provider fail on cue.

Every decision is a pure function of the request's ordinal (1, 2, 3, ... per server, generation
requests only) and the seed, so a test that sends the same requests sees the same failures.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from itertools import count

import xxhash


@dataclass(frozen=True)
class FaultConfig:
    """How often and how the simulated provider misbehaves (all off by default)."""

    fail_429_every: int = 0
    fail_500_every: int = 0
    fail_rate: float = 0.0
    retry_after_s: int = 1
    stall_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class Fault:
    """What one request suffers: an error status instead of an answer, or a stream cut after some tokens.

    ``cut_after`` counts token events; ``stall`` goes silent there, otherwise invalid data is sent.
    """

    status: int | None = None
    cut_after: int | None = None
    stall: bool = False


NO_FAULT = Fault()


class FaultSchedule:
    """Numbers the generation requests of one server and says which fault each one gets."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self._ordinals = count(1)

    def next(self) -> Fault:
        """The fault for the next request (counted whether or not it fails)."""
        ordinal = next(self._ordinals)
        config = self.config
        if config.fail_429_every and ordinal % config.fail_429_every == 0:
            return Fault(status=429)
        if config.fail_500_every and ordinal % config.fail_500_every == 0:
            return Fault(status=500)
        if config.fail_rate and _unit(ordinal, config.seed) < config.fail_rate:
            return Fault(status=500)
        if config.stall_after_chunks is not None:
            return Fault(cut_after=config.stall_after_chunks, stall=True)
        if config.malformed_after_chunks is not None:
            return Fault(cut_after=config.malformed_after_chunks)
        return NO_FAULT


def _unit(ordinal: int, seed: int) -> float:
    """A number in [0, 1) fixed by the ordinal and seed: the deterministic coin for ``fail_rate``."""
    return xxhash.xxh64_intdigest(ordinal.to_bytes(8, "little"), seed=seed) / 2**64


def _every(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (0 disables)")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be in [0, 1]")
    return value


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failure injection (deterministic; requests are counted from 1)")
    group.add_argument("--fail-429-every", type=_every, default=0, metavar="N", help="answer every Nth request 429")
    group.add_argument("--fail-500-every", type=_every, default=0, metavar="N", help="answer every Nth request 500")
    group.add_argument("--fail-rate", type=_rate, default=0.0, metavar="P", help="answer this fraction 500 (seeded)")
    group.add_argument("--retry-after-s", type=_every, default=1, help="Retry-After sent with a 429")
    cut = group.add_mutually_exclusive_group()
    cut.add_argument(
        "--stall-after-chunks", type=_every, default=None, metavar="K", help="send K tokens, then go silent"
    )
    cut.add_argument(
        "--malformed-after-chunks", type=_every, default=None, metavar="K", help="send K tokens, then invalid data"
    )


def faults_from_args(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig(
        fail_429_every=args.fail_429_every,
        fail_500_every=args.fail_500_every,
        fail_rate=args.fail_rate,
        retry_after_s=args.retry_after_s,
        stall_after_chunks=args.stall_after_chunks,
        malformed_after_chunks=args.malformed_after_chunks,
        seed=args.seed,
    )
