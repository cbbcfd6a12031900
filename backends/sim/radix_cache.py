"""A radix tree over token ids: the prefix cache of SGLang's RadixAttention, without the GPU.

Edges hold token sequences (a whole 8k-token prompt is one node until something diverges from
it), children are keyed by their first page of tokens, and matches are rounded down to whole
pages. Requests pin the nodes they use with a lock count; only unpinned leaves are evicted, least
recently used first. Each cache salt gets its own subtree, so two salts never share a token.

With a KV-event publisher (``--kv-events-config``) each node also keeps its pages' hash digests, and every node
added, evicted or dropped is reported to the publisher; without one nothing is hashed.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

_COMPARE_BLOCK = 64


class KvEventSink(Protocol):
    """What the cache tells a KV-event publisher (``kv_events.KvEventPublisher``)."""

    def stored(self, parent: bytes | None, tokens: list[int], namespace: str | None) -> list[bytes]:
        """A new node's tokens under the page digest ``parent`` (None: the root); returns its page digests."""
        ...

    def removed(self, digests: list[bytes]) -> None: ...

    def cleared(self) -> None: ...


class TreeNode:
    """One edge of the tree: the tokens on it and bookkeeping for locks and LRU order."""

    __slots__ = ("children", "hashes", "key", "last_access", "lock_ref", "namespace", "parent")

    def __init__(self, key: list[int], parent: TreeNode | None, namespace: str | None) -> None:
        self.key = key
        self.parent = parent
        self.namespace = namespace
        self.children: dict[Hashable, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.hashes: list[bytes] | None = None
        """One digest per page of ``key``, kept only for a KV-event publisher."""

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


@dataclass(frozen=True)
class MatchResult:
    """The cached prefix length and the node it ends at (lock it to keep the prefix)."""

    length: int
    node: TreeNode


def _common_prefix_len(key: list[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``, compared in C-speed blocks."""
    limit = min(len(key), len(tokens) - start)
    matched = 0
    while matched < limit:
        step = min(_COMPARE_BLOCK, limit - matched)
        if key[matched : matched + step] == tokens[start + matched : start + matched + step]:
            matched += step
            continue
        while key[matched] == tokens[start + matched]:
            matched += 1
        return matched
    return matched


class RadixCache:
    """Prefix cache with page granularity, lock counts and LRU eviction of unlocked leaves."""

    def __init__(self, page_size: int = 1, events: KvEventSink | None = None) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.page_size = page_size
        self.events = events
        self._clear()

    def reset(self) -> None:
        """Drop everything (SGLang's flush_cache); callers must hold no locks."""
        self._clear()
        if self.events is not None:
            self.events.cleared()

    def _clear(self) -> None:
        self._roots: dict[str | None, TreeNode] = {}
        self._leaves: set[TreeNode] = set()
        self._tick = 0
        self._total = 0
        self._protected = 0

    # sizes -----------------------------------------------------------------------------------

    @property
    def total_size(self) -> int:
        """Tokens held by the tree."""
        return self._total

    @property
    def protected_size(self) -> int:
        """Tokens on paths that running requests have locked."""
        return self._protected

    @property
    def evictable_size(self) -> int:
        return self._total - self._protected

    # lookups and updates ---------------------------------------------------------------------

    def _child_key(self, tokens: Sequence[int], start: int) -> Hashable:
        if self.page_size == 1:
            return tokens[start]
        return tuple(tokens[start : start + self.page_size])

    def _aligned(self, length: int) -> int:
        return length - length % self.page_size

    def _root(self, namespace: str | None, create: bool) -> TreeNode | None:
        root = self._roots.get(namespace)
        if root is None and create:
            root = TreeNode([], None, namespace)
            root.lock_ref = 1
            self._roots[namespace] = root
        return root

    def _touch(self, node: TreeNode) -> None:
        self._tick += 1
        node.last_access = self._tick

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut ``node``'s edge after ``at`` tokens; returns the new upper node."""
        assert node.parent is not None
        upper = TreeNode(node.key[:at], node.parent, node.namespace)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        if node.hashes is not None:
            pages = at // self.page_size
            upper.hashes, node.hashes = node.hashes[:pages], node.hashes[pages:]
        node.parent.children[self._child_key(node.key, 0)] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[self._child_key(node.key, 0)] = node
        return upper

    def _walk(self, root: TreeNode, tokens: Sequence[int]) -> tuple[int, TreeNode]:
        """Follow ``tokens`` from ``root`` (splitting a partly matched edge); refresh access order."""
        node = root
        matched = 0
        self._touch(node)
        while matched < len(tokens):
            child = node.children.get(self._child_key(tokens, matched))
            if child is None:
                break
            common = self._aligned(_common_prefix_len(child.key, tokens, matched))
            if common == 0:
                break
            if common < len(child.key):
                child = self._split(child, common)
            self._touch(child)
            matched += common
            node = child
        return matched, node

    def match_prefix(self, tokens: Sequence[int], namespace: str | None = None) -> MatchResult:
        """The longest cached prefix of ``tokens`` (whole pages only) in ``namespace``."""
        tokens = tokens[: self._aligned(len(tokens))]
        root = self._root(namespace, create=True)
        assert root is not None
        length, node = self._walk(root, tokens)
        return MatchResult(length=length, node=node)

    def cached_len(self, tokens: Sequence[int], namespace: str | None = None) -> int:
        """How much of ``tokens`` a match would find now, without touching the tree (no split, no access refresh):
        for figures that must not change what is evicted."""
        tokens = tokens[: self._aligned(len(tokens))]
        node = self._root(namespace, create=False)
        matched = 0
        while node is not None and matched < len(tokens):
            child = node.children.get(self._child_key(tokens, matched))
            if child is None:
                break
            common = self._aligned(_common_prefix_len(child.key, tokens, matched))
            matched += common
            node = child if common == len(child.key) else None
        return matched

    def insert(self, tokens: Sequence[int], namespace: str | None = None) -> tuple[int, TreeNode]:
        """Add ``tokens`` (whole pages only); returns (length that was already cached, last node)."""
        tokens = list(tokens[: self._aligned(len(tokens))])
        root = self._root(namespace, create=True)
        assert root is not None
        matched, node = self._walk(root, tokens)
        if matched < len(tokens):
            leaf = TreeNode(tokens[matched:], node, namespace)
            if self.events is not None:
                parent = None if node.is_root else node.hashes[-1]  # type: ignore[index]
                leaf.hashes = self.events.stored(parent, leaf.key, namespace)
            self._touch(leaf)
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._leaves.discard(node)
            self._leaves.add(leaf)
            self._total += len(leaf.key)
            node = leaf
        return matched, node

    # locking ---------------------------------------------------------------------------------

    def lock(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors so eviction leaves them alone."""
        while not node.is_root:
            if node.lock_ref == 0:
                self._protected += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while not node.is_root:
            if node.lock_ref == 1:
                self._protected -= len(node.key)
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "unlock without lock"
            assert node.parent is not None
            node = node.parent

    # eviction --------------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` (if possible) from unlocked leaves, LRU first; returns freed."""
        heap = [leaf for leaf in self._leaves if leaf.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            freed += len(leaf.key)
            parent = self._remove_leaf(leaf)
            if parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return freed

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode | None:
        parent = leaf.parent
        assert parent is not None
        del parent.children[self._child_key(leaf.key, 0)]
        if self.events is not None:
            self.events.removed(leaf.hashes or [])
        self._leaves.discard(leaf)
        self._total -= len(leaf.key)
        if parent.is_root:
            if not parent.children and parent.namespace is not None:
                del self._roots[parent.namespace]
            return None
        if not parent.children:
            self._leaves.add(parent)
        return parent

    # introspection (tests, debugging) -------------------------------------------------------

    def namespaces(self) -> list[str | None]:
        """The namespaces that hold tokens."""
        return [namespace for namespace, root in self._roots.items() if root.children]

    def cached_sequences(self, namespace: str | None = None) -> list[list[int]]:
        """Every root-to-leaf token sequence in ``namespace``."""
        root = self._roots.get(namespace)
        if root is None:
            return []
        sequences: list[list[int]] = []
        stack: list[tuple[TreeNode, list[int]]] = [(root, [])]
        while stack:
            node, prefix = stack.pop()
            path = prefix + node.key
            if not node.children and not node.is_root:
                sequences.append(path)
            stack.extend((child, path) for child in node.children.values())
        return sequences
