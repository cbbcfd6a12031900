"""Which prefix blocks each replica probably holds: a bounded LRU per replica over chained block hashes.

One table maps a block hash to a bit mask of the replicas holding it, so one lookup answers for all
replicas together. Blocks of a request are touched deepest first, so within a replica a prefix's root is
always more recent than its tail and LRU eviction trims prefixes from the end, as a radix cache does. A
replica therefore holds a leading run of any chain, which lets a lookup bisect rather than walk every block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class _ReplicaBlocks:
    bit: int
    nominal: int
    """Blocks the replica's KV cache could hold if nothing else competed for it."""
    capacity: int
    """Blocks we believe it keeps: shrunk when it reports misses the index did not predict."""
    lru: OrderedDict[int, None] = field(default_factory=OrderedDict)


class PrefixIndex:
    """In-process prefix index. Memory is bounded by the sum of the replicas' capacities in blocks."""

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}
        self._replicas: dict[str, _ReplicaBlocks] = {}
        self._names_by_bit: dict[int, str] = {}
        self._bits: dict[str, int] = {}

    def set_capacity(self, replica: str, blocks: int) -> None:
        """Register ``replica`` or change how many blocks it can hold (from its KV capacity)."""
        blocks = max(1, blocks)
        entry = self._replicas.get(replica)
        if entry is None:
            bit = lowest_free_bit(self._names_by_bit)
            entry = self._replicas[replica] = _ReplicaBlocks(bit=bit, nominal=blocks, capacity=blocks)
            self._names_by_bit[bit] = replica
            self._bits[replica] = bit
        entry.nominal = blocks
        entry.capacity = blocks
        self._evict(entry)

    def penalize(self, replica: str) -> None:
        """The replica held less than predicted: believe it keeps less, dropping the oldest entries."""
        entry = self._replicas.get(replica)
        if entry is not None:
            entry.capacity = max(entry.nominal // 10, 1, int(entry.capacity * 0.8))
            self._evict(entry)

    def reward(self, replica: str) -> None:
        """The replica held what was predicted: let the believed capacity creep back to nominal."""
        entry = self._replicas.get(replica)
        if entry is not None and entry.capacity < entry.nominal:
            entry.capacity = min(entry.nominal, entry.capacity + max(1, entry.nominal // 50))

    def match(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """How many leading blocks of ``hashes`` each of ``replicas`` holds (:func:`leading_depths`)."""
        depths, mask = known_replicas(replicas, self._bits)
        return leading_depths(self._holders, hashes, mask, self._names_by_bit, depths)

    def insert(self, replica: str, hashes: Sequence[int]) -> None:
        """``replica`` was sent a request with these blocks: it will hold them once prefill runs."""
        entry = self._replicas[replica]
        lru = entry.lru
        held = _leading_run(lru, hashes)
        try:
            self._add_deepest_first(entry, hashes[held:])
            # The blocks already held become the most recent, deepest first; the loop runs in C.
            deque(map(lru.move_to_end, reversed(hashes[:held])), maxlen=0)
        except KeyError:
            # A gap in the chain (see forget_after) misled the bisection: walk every block, which fills it.
            self._add_deepest_first(entry, hashes)
        self._evict(entry)

    def _add_deepest_first(self, entry: _ReplicaBlocks, blocks: Sequence[int]) -> None:
        lru = entry.lru
        touch = lru.move_to_end
        bit = 1 << entry.bit
        holders = self._holders
        get = holders.get
        for block in reversed(blocks):
            if block in lru:
                touch(block)
            else:
                lru[block] = None
                holders[block] = get(block, 0) | bit

    def knows(self, replica: str) -> bool:
        return replica in self._replicas

    def replicas(self) -> list[str]:
        return list(self._replicas)

    def remove(self, replica: str) -> None:
        """The replica left the config: its entries and its bit go, so memory follows the config in force."""
        entry = self._replicas.pop(replica, None)
        if entry is not None:
            for block in entry.lru:
                self._release(block, entry.bit)
            del self._names_by_bit[entry.bit]
            del self._bits[replica]

    def insert_if_known(self, replica: str, hashes: Sequence[int]) -> None:
        """Like :meth:`insert`, for changes learned from other processes, which may know other replicas."""
        if replica in self._replicas:
            self.insert(replica, hashes)

    def forget_after(self, replica: str, hashes: Sequence[int], depth: int) -> None:
        """The replica reported holding only ``depth`` blocks of ``hashes``: drop the rest for it.

        If a concurrent request sent a longer chain through those blocks, this leaves a gap in that chain
        (its deeper blocks stay). That request will compute the blocks anyway, so a bisected match reading
        past the gap is right, and its next insert fills the gap."""
        entry = self._replicas.get(replica)
        if entry is not None:
            for block in hashes[depth:]:
                if block in entry.lru:
                    del entry.lru[block]
                    self._release(block, entry.bit)

    def clear(self, replica: str) -> None:
        """The replica restarted or flushed its cache."""
        entry = self._replicas.get(replica)
        if entry is not None:
            for block in entry.lru:
                self._release(block, entry.bit)
            entry.lru.clear()

    def blocks_held(self, replica: str) -> int:
        entry = self._replicas.get(replica)
        return len(entry.lru) if entry else 0

    def believed_capacity(self, replica: str) -> int:
        entry = self._replicas.get(replica)
        return entry.capacity if entry else 0

    def _evict(self, entry: _ReplicaBlocks) -> None:
        while len(entry.lru) > entry.capacity:
            block, _ = entry.lru.popitem(last=False)
            self._release(block, entry.bit)

    def _release(self, block: int, bit: int) -> None:
        remaining = self._holders.get(block, 0) & ~(1 << bit)
        if remaining:
            self._holders[block] = remaining
        else:
            self._holders.pop(block, None)


def known_replicas(replicas: Iterable[str], bits: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """Those of ``replicas`` an index knows (``bits``: each one's bit), each at depth 0 in the caller's order, and
    their bit mask: the start of :func:`leading_depths`."""
    depths: dict[str, int] = {}
    mask = 0
    for name in replicas:
        bit = bits.get(name)
        if bit is not None:
            depths[name] = 0
            mask |= 1 << bit
    return depths, mask


def leading_depths(
    holders: Mapping[int, int], hashes: Sequence[int], mask: int, names: Mapping[int, str], depths: dict[str, int]
) -> dict[str, int]:
    """Fill ``depths`` (each replica in ``mask``, at 0, in the caller's order) with how many leading blocks of
    ``hashes`` each holds, given each block's holders as a bit mask and each bit's replica in ``names``.

    Each replica holds a leading run of any chain, so the replicas holding block i can only drop out as i grows.
    Each place where some drop out is found by bisection: a dozen lookups for a long prompt rather than one per
    block.
    """
    get = holders.get
    depth, end = 0, len(hashes)
    while mask and depth < end:
        # The first block at or after ``depth`` that some replica in ``mask`` lacks; most often ``depth``.
        lo, hi = depth, end
        if get(hashes[lo], 0) & mask == mask:
            lo += 1
            while lo < hi:
                mid = (lo + hi) // 2
                if get(hashes[mid], 0) & mask == mask:
                    lo = mid + 1
                else:
                    hi = mid
        if lo == end:
            break
        held = get(hashes[lo], 0) & mask
        if lo:  # replicas lost at the first block keep their 0
            for name in _names_in(mask & ~held, names):
                depths[name] = lo
        mask = held
        depth = lo + 1
    for name in _names_in(mask, names):
        depths[name] = end
    return depths


def _names_in(mask: int, names: Mapping[int, str]) -> list[str]:
    found = []
    while mask:
        low = mask & -mask
        found.append(names[low.bit_length() - 1])
        mask ^= low
    return found


def lowest_free_bit(taken: Mapping[int, str]) -> int:
    bit = 0
    while bit in taken:
        bit += 1
    return bit


def _leading_run(lru: OrderedDict[int, None], hashes: Sequence[int]) -> int:
    """How many leading blocks of ``hashes`` ``lru`` holds: by bisection, since it holds a leading run."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi) // 2
        if hashes[mid] in lru:
            lo = mid + 1
        else:
            hi = mid
    return lo
