"""The radix prefix cache: matching, splitting, locking, LRU eviction, namespaces, pages."""

from __future__ import annotations

import time

from spillgate.backends.sim.radix_cache import RadixCache


def test_match_returns_cached_prefix_length() -> None:
    cache = RadixCache()
    assert cache.match_prefix([1, 2, 3]).length == 0
    cache.insert([1, 2, 3, 4, 5])
    assert cache.match_prefix([1, 2, 3, 9]).length == 3
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).length == 5
    assert cache.match_prefix([2, 3]).length == 0
    assert cache.total_size == 5


def test_insert_reports_existing_prefix_and_splits_edges() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    existing, _ = cache.insert([1, 2, 7, 8])
    assert existing == 2
    assert cache.total_size == 6
    assert sorted(cache.cached_sequences()) == [[1, 2, 3, 4], [1, 2, 7, 8]]


def test_eviction_is_lru_over_unlocked_leaves() -> None:
    cache = RadixCache()
    cache.insert([1, 1, 1])
    cache.insert([2, 2, 2])
    cache.insert([3, 3, 3])
    cache.match_prefix([1, 1, 1])  # touch: now [2, 2, 2] is least recently used
    assert cache.evict(1) == 3
    assert cache.match_prefix([2, 2, 2]).length == 0
    assert cache.match_prefix([1, 1, 1]).length == 3
    assert cache.match_prefix([3, 3, 3]).length == 3


def test_locked_paths_survive_eviction() -> None:
    cache = RadixCache()
    _, node = cache.insert([1, 2, 3, 4])
    cache.insert([9, 9])
    cache.lock(node)
    assert cache.protected_size == 4 and cache.evictable_size == 2
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4]).length == 4
    cache.unlock(node)
    assert cache.evictable_size == 4
    assert cache.evict(100) == 4
    assert cache.total_size == 0


def test_evicting_a_leaf_exposes_its_parent() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    assert cache.evict(3) >= 3
    assert cache.total_size == 0


def test_split_node_keeps_lock_accounting() -> None:
    cache = RadixCache()
    _, node = cache.insert([1, 2, 3, 4])
    cache.lock(node)
    cache.insert([1, 2, 5])  # splits the locked edge
    assert cache.protected_size == 4
    assert cache.evictable_size == 1
    cache.unlock(node)
    assert cache.protected_size == 0


def test_namespaces_never_share_tokens() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], namespace="a")
    assert cache.match_prefix([1, 2, 3], namespace="b").length == 0
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.match_prefix([1, 2, 3], namespace="a").length == 3
    cache.evict(10)
    assert cache.match_prefix([1, 2, 3], namespace="a").length == 0


def test_page_size_rounds_matches_down_to_whole_pages() -> None:
    cache = RadixCache(page_size=4)
    cache.insert(list(range(10)))  # only 8 tokens (two pages) are cached
    assert cache.total_size == 8
    assert cache.match_prefix(list(range(10))).length == 8
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 99]).length == 4


def test_reset_empties_the_tree() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3])
    cache.reset()
    assert cache.total_size == 0
    assert cache.match_prefix([1, 2, 3]).length == 0


def test_long_prompts_and_many_requests_stay_fast() -> None:
    cache = RadixCache()
    shared = list(range(8192))
    started = time.perf_counter()
    for index in range(2000):
        tokens = [*shared, 1_000_000 + index, *range(index, index + 64)]
        assert cache.match_prefix(tokens).length >= (8192 if index else 0)
        cache.insert(tokens)
    cache.evict(10_000)
    assert time.perf_counter() - started < 5.0
    assert cache.total_size <= 8192 + 2000 * 65
