"""What each replica's KV cache holds, exactly, from the replica's own KV-cache events.

An engine names its blocks by its own hashes, which the gateway cannot reproduce in general (vLLM seeds them
at random per process). The events carry each block's token ids and its parent, though, so the blocks are
re-chained here the way the gateway fingerprints a prompt: xxh3 over blocks of ``block_tokens`` token ids,
seeded by the cache salt (:func:`~cache.fingerprint.cache_seed`). A prompt's fingerprint then names the same
blocks whatever the engine, its page size or its hash seed.

The engine's block size and the gateway's need only divide one another: with SGLang's page size 1 each
gateway block is 64 engine blocks, with vLLM's 128-token blocks on a CPU each engine block holds two gateway
blocks (and a prompt reuses whole engine blocks only: a match is rounded down to them). A gateway block is
held once the engine block holding its last token is stored (its ancestors are
stored by then) and stops being held when any engine block completing it is removed. Both engines evict
leaves first (a block's ancestors are used at least as recently as it is), so a block never outlives its
parent for long and what a replica holds is a leading run of every chain, as :func:`~cache.index.leading_depths`
expects.

Memory: per engine block, a dict entry and its share of the tokens, about 100 bytes; with page size 1 that is
per token. The record is bounded by ``max_blocks`` per replica; past it the replica's record is cleared and its
subscriber resynchronizes.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import xxhash

from spillgate.cache.fingerprint import cache_seed
from spillgate.cache.index import known_replicas, leading_depths, lowest_free_bit
from spillgate.cache.kv_events import BlocksStored

DEFAULT_MAX_BLOCKS = 8_000_000
"""Engine blocks kept per replica: far beyond a GPU's KV cache even at page size 1."""

_NONE: tuple[int, ...] = ()


class _Run:
    """The blocks of one ``BlockStored`` event: their tokens and, per block, the gateway's chain hash so far."""

    __slots__ = ("block_size", "completes", "marks", "parent", "start", "tokens")

    def __init__(self, parent: int | None, start: int, tokens: array[int], block_size: int, blocks: int) -> None:
        self.parent = parent
        self.start = start
        """Position of the first token in the prompt."""
        self.tokens = tokens
        self.block_size = block_size
        self.marks = array("Q", bytes(8 * blocks))
        """Per block: the gateway's chain hash at the last gateway-block boundary at or before its end."""
        self.completes: list[tuple[int, ...]] = [_NONE] * blocks
        """Per block: the gateway blocks whose last token it holds."""

    def end(self, index: int) -> int:
        return self.start + (index + 1) * self.block_size


@dataclass
class _Replica:
    bit: int
    blocks: dict[int, tuple[_Run, int]] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)
    """Gateway block hash -> how many stored engine blocks complete it (two chains can share tokens)."""
    unchained: int = 0
    """Stored events whose parent was unknown (missed events): their blocks cannot be named."""
    per_engine_block: int = 1
    """Gateway blocks in one engine block: a prompt reuses whole engine blocks only."""


class EngineBlockIndex:
    """Exact prefix index fed by KV-cache events; matched like :class:`~cache.index.PrefixIndex`."""

    def __init__(self, block_tokens: int, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._replicas: dict[str, _Replica] = {}
        self._names_by_bit: dict[int, str] = {}
        self._bits: dict[str, int] = {}
        self._holders: dict[int, int] = {}

    # membership --------------------------------------------------------------------------------

    def add(self, replica: str) -> None:
        if replica not in self._replicas:
            bit = lowest_free_bit(self._names_by_bit)
            self._replicas[replica] = _Replica(bit)
            self._names_by_bit[bit] = replica
            self._bits[replica] = bit

    def remove(self, replica: str) -> None:
        if replica in self._replicas:
            self.clear(replica)
            del self._names_by_bit[self._replicas.pop(replica).bit]
            del self._bits[replica]

    def knows(self, replica: str) -> bool:
        return replica in self._replicas

    def supports(self, block_size: int) -> bool:
        """Whether an engine's blocks of ``block_size`` tokens line up with the gateway's."""
        return block_size % self.block_tokens == 0 or self.block_tokens % block_size == 0

    # events ------------------------------------------------------------------------------------

    def clear(self, replica: str) -> None:
        """The replica dropped everything (``AllBlocksCleared``, a restart) or events were lost."""
        entry = self._replicas.get(replica)
        if entry is None:
            return
        bit = 1 << entry.bit
        for block in entry.held:
            self._release(block, bit)
        entry.held.clear()
        entry.blocks.clear()
        entry.unchained = 0

    def stored(self, replica: str, event: BlocksStored) -> list[int] | None:
        """Record ``event``'s blocks; returns the gateway blocks they complete, or None when they cannot be named
        (unknown parent, a block size that does not line up, the record full): the caller's events were lost."""
        entry = self._replicas.get(replica)
        if entry is None:
            return []
        size = event.block_size
        if not self.supports(size) or len(entry.blocks) + len(event.hashes) > self.max_blocks:
            return None
        if event.parent is None:
            start, mark, head = 0, cache_seed(event.salt), array("I")
        else:
            found = entry.blocks.get(event.parent)
            if found is None:
                entry.unchained += 1
                return None
            parent_run, parent_index = found
            start = parent_run.end(parent_index)
            mark = parent_run.marks[parent_index]
            head = self._tokens_before(entry, parent_run, parent_index, start % self.block_tokens)
        entry.per_engine_block = max(1, size // self.block_tokens)
        return self._add_run(entry, event, start, mark, head)

    def removed(self, replica: str, hashes: Iterable[int]) -> list[int]:
        """Forget engine blocks; returns the gateway blocks the replica no longer holds."""
        entry = self._replicas.get(replica)
        released: list[int] = []
        if entry is None:
            return released
        bit = 1 << entry.bit
        held = entry.held
        for engine_hash in hashes:
            found = entry.blocks.pop(engine_hash, None)
            if found is None:
                continue
            run, index = found
            for block in run.completes[index]:
                count = held[block] - 1
                if count:
                    held[block] = count
                else:
                    del held[block]
                    self._release(block, bit)
                    released.append(block)
        return released

    # lookups -----------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """How many leading gateway blocks of ``hashes`` each of ``replicas`` (those with a record) holds."""
        known = self._replicas
        depths, mask = known_replicas(replicas, self._bits)
        leading_depths(self._holders, hashes, mask, self._names_by_bit, depths)
        for name, depth in depths.items():
            whole = known[name].per_engine_block
            if whole > 1:
                depths[name] = depth - depth % whole
        return depths

    def in_whole_engine_blocks(self, replica: str, depth: int) -> int:
        """``depth`` gateway blocks rounded down to the replica's whole engine blocks (all it can reuse)."""
        entry = self._replicas.get(replica)
        whole = entry.per_engine_block if entry is not None else 1
        return depth - depth % whole

    def blocks_held(self, replica: str) -> int:
        """Gateway blocks the replica holds."""
        entry = self._replicas.get(replica)
        return len(entry.held) if entry else 0

    def engine_blocks(self, replica: str) -> int:
        entry = self._replicas.get(replica)
        return len(entry.blocks) if entry else 0

    # internals ---------------------------------------------------------------------------------

    def _add_run(self, entry: _Replica, event: BlocksStored, start: int, mark: int, head: array[int]) -> list[int]:
        size = event.block_size
        count = len(event.hashes)
        run = _Run(event.parent, start, array("I", event.token_ids), size, count)
        step = self.block_tokens
        # Tokens from the last gateway-block boundary at or before ``start`` to the end of the run.
        base = start - len(head)
        tokens = head + run.tokens if head else run.tokens
        data = memoryview(tokens).cast("B")
        width = tokens.itemsize
        digest = xxhash.xxh3_64_intdigest
        bit = 1 << entry.bit
        held, holders, blocks = entry.held, self._holders, entry.blocks
        boundary = base + step
        added: list[int] = []
        for index, engine_hash in enumerate(event.hashes):
            end = start + (index + 1) * size
            completed: list[int] = []
            while boundary <= end:
                offset = (boundary - step - base) * width
                mark = digest(data[offset : offset + step * width], mark)
                completed.append(mark)
                boundary += step
            run.marks[index] = mark
            if engine_hash in blocks:
                continue  # stored again without a removal: already counted
            blocks[engine_hash] = (run, index)
            if completed:
                run.completes[index] = tuple(completed)
                for block in completed:
                    previous = held.get(block, 0)
                    held[block] = previous + 1
                    if not previous:
                        holders[block] = holders.get(block, 0) | bit
                added.extend(completed)
        return added

    def _tokens_before(self, entry: _Replica, run: _Run, index: int, length: int) -> array[int]:
        """The last ``length`` tokens of the chain ending at ``run``'s block ``index``."""
        pieces: list[array[int]] = []
        needed = length
        while needed > 0:
            available = (index + 1) * run.block_size
            take = min(needed, available)
            pieces.append(run.tokens[available - take : available])
            needed -= take
            if needed <= 0 or run.parent is None:
                break
            found = entry.blocks.get(run.parent)
            if found is None:
                break  # cannot happen while ancestors outlive their children; a short head only misnames blocks
            run, index = found
        head = array("I")
        for piece in reversed(pieces):
            head.extend(piece)
        return head

    def _release(self, block: int, bit: int) -> None:
        remaining = self._holders.get(block, 0) & ~bit
        if remaining:
            self._holders[block] = remaining
        else:
            self._holders.pop(block, None)
