"""Routing-decision cost: an 8k-token chat prompt over 16 replicas, fingerprint + index match + policy.

    python -m tests.bench.decision_latency [--replicas 16] [--prompt-tokens 8192] [--rounds 5000]

Prints p50/p99 in microseconds for the whole in-process decision (the gateway's own code path:
fingerprint, index match, registry snapshot, policy, index insert), and the index's size after the run.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from backends.registry import Backend, BackendRegistry
from gateway.config import PrefixConfig
from gateway.prefix import PrefixTracker
from policies.registry import build_policy
from policies.types import RouteRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=64, help="distinct shared system prompts")
    args = parser.parse_args()

    rng = random.Random(7)
    names = [f"r{i}" for i in range(args.replicas)]
    defaults = PrefixConfig()  # the gateway's own defaults
    tracker = PrefixTracker(block_chars=defaults.block_chars, max_blocks=defaults.max_blocks)
    for name in names:
        tracker.capacity_known(name, 500_000)
    policy = build_policy("cache_aware")
    registry = BackendRegistry(
        [
            Backend(n, "replica", f"http://127.0.0.1:{9000 + i}", "m", in_flight=rng.randrange(8))
            for i, n in enumerate(names)
        ],
        interval_s=1.0,
        timeout_s=1.0,
        unhealthy_after=2,
    )
    # ~4 characters per token, as English text tokenizes: a 3-letter word and a space.
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(args.prompt_tokens)]
    systems = [f"group {g}: " + " ".join(words[: args.prompt_tokens - 64]) for g in range(args.groups)]

    gc.freeze()  # as `spillgate serve` does once its long-lived state is built
    samples = []
    for round_ in range(args.rounds):
        payload = {
            "messages": [
                {"role": "system", "content": systems[round_ % args.groups]},
                {"role": "user", "content": f"question {round_} " + " ".join(words[:64])},
            ]
        }
        started = time.perf_counter()
        fingerprint = tracker.fingerprint(payload, chat=True, model="chat", salt="tenant")
        matched = tracker.matched_blocks(fingerprint, names)
        per_block = tracker.tokens_per_block
        snapshot = registry.snapshot(names, {n: min(b * per_block, args.prompt_tokens) for n, b in matched.items()})
        request = RouteRequest("tenant", "chat", args.prompt_tokens, 256, True, round_, fingerprint.prefix_key)
        decision = policy.decide(request, snapshot)
        tracker.dispatched(decision.backend, fingerprint)
        samples.append(time.perf_counter() - started)

    samples.sort()
    p50 = statistics.median(samples) * 1e6
    p99 = samples[int(len(samples) * 0.99)] * 1e6
    held = sum(tracker.index.blocks_held(n) for n in names)
    print(
        f"decision for a {args.prompt_tokens}-token prompt over {args.replicas} replicas "
        f"({len(fingerprint.hashes)} blocks): p50 {p50:.0f} us, p99 {p99:.0f} us; index holds {held} blocks"
    )


if __name__ == "__main__":
    main()
