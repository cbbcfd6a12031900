"""Prefix fingerprints and the prefix index."""

from __future__ import annotations

import random

from spillgate.cache.fingerprint import block_hashes, canonical_chat, prefix_seed
from spillgate.cache.index import PrefixIndex

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [SYSTEM]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "why? " * 30})
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "because. " * 30})
    return messages


def test_turn_n_plus_one_extends_turn_n() -> None:
    seed = prefix_seed("m", "tenant-a")
    shorter = block_hashes(canonical_chat(conversation(2)), seed, block_chars=64)
    longer = block_hashes(canonical_chat(conversation(3)), seed, block_chars=64)
    assert len(longer) > len(shorter) > 0
    assert longer[: len(shorter)] == shorter
    assert canonical_chat(conversation(3)).startswith(canonical_chat(conversation(2)))


def test_tenants_and_models_never_collide() -> None:
    text = canonical_chat(conversation(2))
    a = set(block_hashes(text, prefix_seed("m", "tenant-a"), block_chars=64))
    b = set(block_hashes(text, prefix_seed("m", "tenant-b"), block_chars=64))
    other_model = set(block_hashes(text, prefix_seed("m2", "tenant-a"), block_chars=64))
    assert a and not a & b and not a & other_model


def test_chained_hash_names_the_whole_prefix() -> None:
    seed = prefix_seed("m", "")
    first = block_hashes("A" * 64 + "B" * 64, seed, block_chars=64)
    second = block_hashes("C" * 64 + "B" * 64, seed, block_chars=64)
    assert first[1] != second[1], "the same block after a different prefix must hash differently"


def test_block_cap() -> None:
    assert len(block_hashes("x" * 10_000, 0, block_chars=10, max_blocks=7)) == 7
    assert block_hashes("short", 0, block_chars=64) == []


def test_index_matches_leading_blocks_per_replica() -> None:
    index = PrefixIndex()
    for name in ("r0", "r1", "r2"):
        index.set_capacity(name, 100)
    blocks = list(range(1, 11))
    index.insert("r0", blocks[:10])
    index.insert("r1", blocks[:4])
    assert index.match(blocks, ["r0", "r1", "r2"]) == {"r0": 10, "r1": 4, "r2": 0}
    assert index.match([99, *blocks], ["r0", "r1"]) == {"r0": 0, "r1": 0}


def test_index_capacity_evicts_tails_first() -> None:
    index = PrefixIndex()
    index.set_capacity("r0", 6)
    index.insert("r0", [1, 2, 3, 4])
    index.insert("r0", [10, 11, 12, 13])
    assert index.blocks_held("r0") == 6
    assert index.match([10, 11, 12, 13], ["r0"]) == {"r0": 4}
    assert index.match([1, 2, 3, 4], ["r0"]) == {"r0": 2}, "the old prefix keeps its root, loses its tail"


def test_index_sending_a_prefix_again_makes_it_recent() -> None:
    index = PrefixIndex()
    index.set_capacity("r0", 8)
    index.insert("r0", [1, 2, 3, 4])
    index.insert("r0", [10, 11, 12, 13])
    index.insert("r0", [1, 2, 3, 4, 5])
    index.insert("r0", [20, 21])
    assert index.match([1, 2, 3, 4, 5], ["r0"]) == {"r0": 5}
    assert index.match([10, 11, 12, 13], ["r0"]) == {"r0": 1}, "the prefix not sent again ages out, tail first"


def test_feedback_and_restart_correct_the_index() -> None:
    index = PrefixIndex()
    index.set_capacity("r0", 100)
    index.insert("r0", [1, 2, 3, 4, 5])
    index.forget_after("r0", [1, 2, 3, 4, 5], 2)
    assert index.match([1, 2, 3, 4, 5], ["r0"]) == {"r0": 2}
    index.clear("r0")
    assert index.match([1, 2], ["r0"]) == {"r0": 0}
    assert index.blocks_held("r0") == 0


def test_a_failed_request_withdrawn_under_a_longer_one_leaves_a_gap_that_the_next_insert_fills() -> None:
    index = PrefixIndex()
    index.set_capacity("r0", 100)
    index.insert("r0", [10, 11])
    shorter, longer = [10, 11, 12], [10, 11, 12, 13, 14, 15, 16, 17]
    index.insert("r0", shorter)  # predicted 2 blocks
    index.insert("r0", longer)  # sent meanwhile: it computes block 12 too
    index.forget_after("r0", shorter, 2)  # the shorter one failed
    assert index.match(longer, ["r0"]) == {"r0": 8}, "the longer request still computes every block"
    index.insert("r0", longer)  # must not trip over the gap
    assert index.blocks_held("r0") == 8
    assert index.match(shorter, ["r0"]) == {"r0": 3}


def test_a_removed_replica_leaves_nothing_behind() -> None:
    index = PrefixIndex()
    index.set_capacity("r0", 100)
    index.set_capacity("r1", 100)
    index.insert("r0", [1, 2, 3])
    index.insert("r1", [1, 2])
    index.remove("r0")
    assert index.replicas() == ["r1"]
    assert index.match([1, 2, 3], ["r0", "r1"]) == {"r1": 2}
    index.set_capacity("r2", 100)  # takes the bit r0 had: nothing of r0's may show through it
    assert index.match([1, 2, 3], ["r1", "r2"]) == {"r1": 2, "r2": 0}
    index.remove("r1")
    index.remove("r2")
    assert index.match([1, 2, 3], ["r1", "r2"]) == {}
    assert index.blocks_held("r1") == 0


def test_tracker_feedback_shrinks_belief_on_misses_and_restores_on_hits() -> None:
    from spillgate.gateway.dispatch.prefix import PrefixTracker

    tracker = PrefixTracker(block_chars=64, max_blocks=512)
    tracker.capacity_known("r0", 100 * tracker.tokens_per_block)  # room for 100 blocks
    nominal = tracker.index.believed_capacity("r0")
    fingerprint = tracker.fingerprint({"messages": conversation(3)}, chat=True, salt="t")
    tracker.dispatched("r0", fingerprint)
    predicted = len(fingerprint.hashes)
    tracker.observed(
        "r0", fingerprint, predicted, {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 0}}
    )
    shrunk = tracker.index.believed_capacity("r0")
    assert shrunk < nominal
    for _ in range(200):
        tracker.observed(
            "r0", fingerprint, predicted, {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 1000}}
        )
    assert tracker.index.believed_capacity("r0") == nominal
    # A backend that does not report cache hits teaches nothing.
    tracker.observed("r0", fingerprint, predicted, {"prompt_tokens": 1000})
    assert tracker.index.believed_capacity("r0") == nominal


def test_tracker_withdraws_a_failed_dispatch() -> None:
    from spillgate.gateway.dispatch.prefix import PrefixTracker

    tracker = PrefixTracker(block_chars=64, max_blocks=512)
    tracker.capacity_known("r0", 100_000)
    fingerprint = tracker.fingerprint({"messages": conversation(2)}, chat=True, salt="t")
    tracker.dispatched("r0", fingerprint)
    assert tracker.matched_blocks(fingerprint, ["r0"]) == {"r0": len(fingerprint.hashes)}
    tracker.failed("r0", fingerprint, 0)
    assert tracker.matched_blocks(fingerprint, ["r0"]) == {"r0": 0}


def test_index_bisection_agrees_with_a_block_by_block_walk() -> None:
    """Random chained traffic through every way the index changes; each match must equal the plain walk."""
    rng = random.Random(3)
    index = PrefixIndex()
    names = [f"r{i}" for i in range(5)]
    for name in names:
        index.set_capacity(name, rng.randrange(20, 120))
    roots = [prefix_seed("m", f"group {g}") for g in range(6)]

    def chain(root: int) -> list[int]:
        text = "".join(rng.choice("ab") for _ in range(rng.randrange(0, 48))) * 4
        return block_hashes(text, root, block_chars=4)

    def walk(hashes: list[int], replica: str) -> int:
        depth = 0
        while depth < len(hashes) and index.match(hashes[depth : depth + 1], [replica])[replica]:
            depth += 1
        return depth

    for step in range(2000):
        hashes = chain(rng.choice(roots))
        replica = rng.choice(names)
        matched = index.match(hashes, names)
        assert matched == {name: walk(hashes, name) for name in names}, step
        action = rng.random()
        if action < 0.9:
            index.insert(replica, hashes)
            if action < 0.1:  # the request failed: withdraw what it added
                index.forget_after(replica, hashes, matched[replica])
        elif action < 0.97:
            index.penalize(replica)
        else:
            index.clear(replica)
