"""The exact prefix index re-chains engine blocks into the gateway's fingerprint blocks, whatever the engine's
block size, and follows stores, removals and clears as a radix cache does."""

from __future__ import annotations

import random
from array import array

import pytest

from spillgate.cache.engine_index import EngineBlockIndex
from spillgate.cache.fingerprint import cache_seed, token_block_hashes
from spillgate.cache.kv_events import BlocksStored

STEP = 16


class Engine:
    """A toy engine cache: a trie of blocks of ``size`` tokens, evicting leaves, publishing what it does."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size = size
        self.rng = rng
        self.blocks: dict[tuple[str | None, tuple[int, ...]], int] = {}  # (salt, prefix tokens) -> engine hash
        self.parents: dict[int, int | None] = {}

    def store(self, tokens: list[int], salt: str | None) -> BlocksStored | None:
        size = self.size
        whole = len(tokens) // size * size
        parent, first, hashes = None, None, []
        for end in range(size, whole + 1, size):
            key = (salt, tuple(tokens[:end]))
            known = self.blocks.get(key)
            if known is not None and first is None:
                parent = known
                continue
            if first is None:
                first = end - size
            engine_hash = self.rng.getrandbits(63) - (1 << 62)  # signed, as SGLang's are
            self.blocks[key] = engine_hash
            self.parents[engine_hash] = hashes[-1] if hashes else parent
            hashes.append(engine_hash)
        if first is None:
            return None
        return BlocksStored(tuple(hashes), parent, tokens[first:whole], size, salt)

    def evict_leaf(self) -> int | None:
        children = {parent for parent in self.parents.values() if parent is not None}
        leaves = [key for key, value in self.blocks.items() if value not in children]
        if not leaves:
            return None
        key = self.rng.choice(leaves)
        engine_hash = self.blocks.pop(key)
        del self.parents[engine_hash]
        return engine_hash

    def held_tokens(self, tokens: list[int], salt: str | None) -> int:
        held = 0
        for end in range(self.size, len(tokens) + 1, self.size):
            if (salt, tuple(tokens[:end])) not in self.blocks:
                break
            held = end
        return held


@pytest.mark.parametrize("size", [1, 4, 16, 32])
def test_the_index_says_what_the_engine_holds_through_stores_and_evictions(size: int) -> None:
    rng = random.Random(size)
    engine = Engine(size, rng)
    index = EngineBlockIndex(STEP)
    index.add("r")
    stems = [[rng.randrange(50) for _ in range(rng.randrange(0, 70))] for _ in range(5)]
    prompts = [stem + [rng.randrange(50) for _ in range(rng.randrange(0, 90))] for stem in stems for _ in range(4)]
    salts = [None, "tenant-a"]
    for _ in range(400):
        if rng.random() < 0.6:
            event = engine.store(rng.choice(prompts), rng.choice(salts))
            if event is not None:
                assert index.stored("r", event) is not None
        else:
            evicted = engine.evict_leaf()
            if evicted is not None:
                index.removed("r", [evicted])
        for prompt in rng.sample(prompts, 3):
            salt = rng.choice(salts)
            hashes = token_block_hashes(array("I", prompt), cache_seed(salt), block_tokens=STEP, max_blocks=64)
            assert index.match(hashes, ["r"]) == {"r": engine.held_tokens(prompt, salt) // STEP}


def test_engine_blocks_larger_than_the_gateways_hold_several_of_its_blocks() -> None:
    index = EngineBlockIndex(STEP)
    index.add("r")
    tokens = list(range(100, 100 + 128))
    stored = index.stored("r", BlocksStored((11, 12), None, tokens, 64, None))
    assert stored is not None and len(stored) == 8
    hashes = token_block_hashes(array("I", tokens), cache_seed(None), block_tokens=STEP, max_blocks=64)
    assert index.match(hashes, ["r"]) == {"r": 8}
    assert len(index.removed("r", [12])) == 4
    assert index.match(hashes, ["r"]) == {"r": 4}


def test_a_block_whose_parent_was_never_seen_cannot_be_named() -> None:
    index = EngineBlockIndex(STEP)
    index.add("r")
    assert index.stored("r", BlocksStored((5,), 4, list(range(16)), 16, None)) is None
    assert index.blocks_held("r") == 0


def test_block_sizes_that_do_not_line_up_are_refused() -> None:
    index = EngineBlockIndex(STEP)
    index.add("r")
    assert not index.supports(24)
    assert index.stored("r", BlocksStored((1,), None, list(range(24)), 24, None)) is None


def test_clearing_a_replica_leaves_the_others() -> None:
    index = EngineBlockIndex(STEP)
    tokens = list(range(32))
    for name in ("a", "b"):
        index.add(name)
        index.stored(name, BlocksStored((1, 2), None, tokens, 16, None))
    index.clear("a")
    hashes = token_block_hashes(array("I", tokens), cache_seed(None), block_tokens=STEP, max_blocks=64)
    assert index.match(hashes, ["a", "b"]) == {"a": 0, "b": 2}
    index.remove("b")
    assert index.match(hashes, ["a", "b"]) == {"a": 0}
