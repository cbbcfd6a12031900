"""The routing hot path's shortcuts keep to their definitions: block hashes, the one-pass index match, shared
TTFT predictions."""

from __future__ import annotations

import random

import xxhash

from spillgate.cache.fingerprint import block_hashes
from spillgate.cache.index import PrefixIndex
from spillgate.policies.prediction import Candidates, predicted_ttft
from spillgate.policies.types import BackendState, RouteRequest


def test_block_hashes_chain_xxh3_over_utf8_blocks() -> None:
    rng = random.Random(1)
    for _ in range(200):
        text = "".join(rng.choice("ab \u00e9\u4e2d\U0001f600") for _ in range(rng.randrange(0, 600)))
        block_chars, max_blocks = rng.choice([16, 17, 256]), rng.choice([1, 3, 512])
        data = text.encode()
        expected, previous = [], 7
        for start in range(0, min(len(data) // block_chars, max_blocks) * block_chars, block_chars):
            previous = xxhash.xxh3_64_intdigest(data[start : start + block_chars], previous)
            expected.append(previous)
        assert block_hashes(text, 7, block_chars=block_chars, max_blocks=max_blocks) == expected


def test_matching_all_replicas_at_once_equals_matching_each_alone() -> None:
    rng = random.Random(2)
    index = PrefixIndex()
    names = [f"r{i}" for i in range(12)]
    for name in names:
        index.set_capacity(name, rng.choice([20, 200]))
    chains = [[rng.getrandbits(64) for _ in range(40)] for _ in range(8)]
    for _ in range(300):
        index.insert(rng.choice(names), rng.choice(chains)[: rng.randrange(0, 41)])
        if rng.random() < 0.1:
            index.penalize(rng.choice(names))
        query = rng.choice(chains)[: rng.randrange(0, 41)]
        asked = [*rng.sample(names, rng.randrange(0, len(names))), "unknown"]
        together = index.match(query, asked)
        assert list(together) == [name for name in asked if name != "unknown"]
        assert together == {name: index.match(query, [name])[name] for name in together}


def test_candidates_predict_each_ttft_once() -> None:
    request = RouteRequest("t", "chat", 8000, 256, True)
    backends = [
        BackendState("a", "replica", in_flight=9, max_running=8, outstanding_tokens=900, tpot_s=0.02),
        BackendState("b", "replica", prefix_tokens=6000, pending_prefill_tokens=4000),
    ]
    candidates = Candidates(request, backends)
    ttfts = candidates.predicted_ttfts()
    assert ttfts == [predicted_ttft(request, b) for b in backends]
    assert candidates.predicted_ttfts() is ttfts
