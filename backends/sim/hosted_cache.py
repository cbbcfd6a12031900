"""Automatic prompt caching the way hosted APIs report it: repeated prefixes of long prompts, in blocks.

OpenAI caches prompts of at least 1,024 tokens and reports the hit in 128-token increments; the
simulator does the same, for both wire formats, so gateways and cost accounting see real
``cached_tokens`` without a GPU. One bounded LRU of chained block hashes per server.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

BLOCK_TOKENS = 128
DEFAULT_CAPACITY_BLOCKS = 1 << 16


class PromptCache:
    """Prefix hits for prompts of at least ``min_tokens`` tokens (0 turns caching off)."""

    def __init__(self, min_tokens: int = 1024, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        self._min_tokens = min_tokens
        self._capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def match_and_insert(self, prompt_ids: Sequence[int]) -> int:
        """How many leading tokens of the prompt were cached; the prompt's blocks are cached from now on."""
        if not self._min_tokens or len(prompt_ids) < self._min_tokens:
            return 0
        digest, cached, hitting = 0, 0, True
        for end in range(BLOCK_TOKENS, len(prompt_ids) + 1, BLOCK_TOKENS):
            digest = xxhash.xxh3_64_intdigest(array("q", prompt_ids[end - BLOCK_TOKENS : end]).tobytes(), seed=digest)
            if hitting and digest in self._blocks:
                cached = end
                self._blocks.move_to_end(digest)
            else:
                hitting = False
                self._blocks[digest] = None
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
        return cached if cached >= self._min_tokens else 0
