"""Routing-decision cost: an 8k-token chat prompt over 16 replicas, fingerprint + index match + policy.

    python -m tests.bench.decision_latency [--replicas 16] [--prompt-tokens 8192] [--rounds 5000]
        [--tokenizer tokenizer.json|MODEL_DIR|simulated --block-tokens 64] [--events --page-size 16]

Prints p50/p99 in microseconds for the whole in-process decision (the gateway's own code path:
fingerprint, index match, registry snapshot, policy, index insert), and the index's size after the run;
then the fingerprint (tokenization and hashing) and the index match alone. With ``--events`` every replica is
followed by KV events (an exact tokenizer is needed): each replica stores a group's prompt, in engine blocks of
``--page-size`` tokens, the first time it is sent one, as an engine would publish it.
Then the same percentiles for a plain Python loop timed to the decision's median: on a shared VM the
machine's own stalls set much of the p99, and this line shows how much.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import spillgate.backends.sim.prompt_encoder  # noqa: F401  (prefix.tokenizer: simulated)
from spillgate.backends.load import OwnLoad
from spillgate.backends.registry import Backend, BackendRegistry
from spillgate.cache.kv_events import BlocksStored, EventBatch
from spillgate.gateway.control.config import PrefixConfig
from spillgate.gateway.dispatch.prefix import PrefixTracker
from spillgate.gateway.state import load_tokenizer
from spillgate.policies.registry import build_policy
from spillgate.policies.types import RouteRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=64, help="distinct shared system prompts")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json: blocks of tokens (prefix.tokenizer)")
    parser.add_argument("--block-tokens", type=int, default=64)
    parser.add_argument("--events", action="store_true", help="replicas followed by their KV events")
    parser.add_argument("--page-size", type=int, default=16, help="the engine's block size, with --events")
    args = parser.parse_args()

    rng = random.Random(7)
    names = [f"r{i}" for i in range(args.replicas)]
    defaults = PrefixConfig()  # the gateway's own defaults
    tracker = PrefixTracker(
        block_chars=defaults.block_chars,
        max_blocks=defaults.max_blocks,
        tokenizer=None if args.tokenizer is None else load_tokenizer(args.tokenizer),
        block_tokens=args.block_tokens,
    )
    for name in names:
        tracker.capacity_known(name, 500_000)
        if args.events:
            tracker.follow(name)
            tracker.reset(name, complete=True)
            tracker.catching_up(name, False)  # caught up: matched on its events, not on the belief
    stored: set[tuple[str, int]] = set()
    policy = build_policy("cache_aware")
    registry = BackendRegistry(
        [
            Backend(n, "replica", f"http://127.0.0.1:{9000 + i}", "m", own=OwnLoad(in_flight=rng.randrange(8)))
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
    samples, fingerprints, matches = [], [], []
    for round_ in range(args.rounds):
        payload = {
            "messages": [
                {"role": "system", "content": systems[round_ % args.groups]},
                {"role": "user", "content": f"question {round_} " + " ".join(words[:64])},
            ]
        }
        started = time.perf_counter()
        fingerprint = tracker.fingerprint(payload, chat=True, salt="tenant")
        fingerprinted = time.perf_counter()
        matched = tracker.matched_blocks(fingerprint, names)
        fingerprints.append(fingerprinted - started)
        matches.append(time.perf_counter() - fingerprinted)
        per_block = tracker.tokens_per_block
        snapshot = registry.snapshot(names, {n: min(b * per_block, args.prompt_tokens) for n, b in matched.items()})
        request = RouteRequest("tenant", "chat", args.prompt_tokens, 256, True, round_, fingerprint.prefix_key)
        decision = policy.decide(request, snapshot)
        tracker.dispatched(decision.backend, fingerprint)
        samples.append(time.perf_counter() - started)
        if args.events and (decision.backend, round_ % args.groups) not in stored:
            stored.add((decision.backend, round_ % args.groups))
            _publish(tracker, decision.backend, payload, args.page_size, rng)

    samples.sort()
    p50 = statistics.median(samples) * 1e6
    p99 = samples[int(len(samples) * 0.99)] * 1e6
    held = sum(tracker.index.blocks_held(n) for n in names)
    print(
        f"decision for a {args.prompt_tokens}-token prompt over {args.replicas} replicas "
        f"({len(fingerprint.hashes)} blocks): p50 {p50:.0f} us, p99 {p99:.0f} us; index holds {held} blocks"
    )
    for label, part in (("fingerprint", fingerprints), ("index match", matches)):
        part.sort()
        print(f"  {label}: p50 {statistics.median(part) * 1e6:.0f} us, p99 {part[int(len(part) * 0.99)] * 1e6:.0f} us")
    if args.events:
        assert tracker.exact is not None
        held = sum(tracker.exact.blocks_held(n) for n in names)
        print(f"  from events: {held} blocks held, sources {sorted({tracker.source(n) for n in names})}")
    loop_p50, loop_p99 = _plain_loop_percentiles(p50 / 1e6, args.rounds)
    print(f"this machine's floor: a plain loop with a {loop_p50:.0f} us median has p99 {loop_p99:.0f} us")


def _publish(tracker: PrefixTracker, replica: str, payload: dict, page: int, rng: random.Random) -> None:
    """What the replica's engine publishes once it has prefilled ``payload``: its whole pages, as one stored run."""
    assert tracker.tokenizer is not None
    ids = tracker.tokenizer.chat(payload["messages"])
    whole = len(ids) // page * page
    hashes = tuple(rng.getrandbits(63) for _ in range(whole // page))
    event = BlocksStored(hashes, None, ids[:whole].tolist(), page, "tenant")
    tracker.apply(replica, EventBatch(seq=0, ts=0.0, events=(event,), rank=0))


def _plain_loop_percentiles(median_s: float, rounds: int) -> tuple[float, float]:
    """p50/p99 in microseconds of a fixed pure-Python loop sized to run for about ``median_s``."""

    def spin(count: int) -> int:
        total = 0
        for i in range(count):
            total += i
        return total

    count = 1000
    for _ in range(3):  # rescale on the median of a few runs until the loop takes about median_s
        trial = []
        for _ in range(101):
            started = time.perf_counter()
            spin(count)
            trial.append(time.perf_counter() - started)
        count = max(1, int(count * median_s / statistics.median(trial)))
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        spin(count)
        samples.append(time.perf_counter() - started)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99)] * 1e6


if __name__ == "__main__":
    main()
