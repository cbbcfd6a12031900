"""Prefix fingerprints: chained xxh3 hashes over fixed-size blocks of a canonical prompt serialization.

The serialization puts tool definitions first, then every message in order, each framed by its role, so
that turn n+1 of a conversation serializes to turn n's text plus more. Block i's hash is seeded with block
i-1's, so one hash names a whole prefix: two requests share block i's hash only if they share every byte up
to the end of block i. The first seed mixes in the model and the tenant's salt, so two tenants (or two
models) never match each other's prefixes.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import xxhash

DEFAULT_BLOCK_CHARS = 256
DEFAULT_MAX_BLOCKS = 512

_RECORD = "\x1e"  # separates messages
_UNIT = "\x1f"  # separates a message's role from its content


def canonical_chat(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
    """Serialize a chat so that a longer conversation extends a shorter one's serialization."""
    return "".join(canonical_records(messages, tools))


def canonical_records(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> list[str]:
    """:func:`canonical_chat` record by record: the tool definitions, then each message framed by its role."""
    parts: list[str] = []
    if tools:
        parts.append(_RECORD + "tools" + _UNIT + orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode())
    for message in messages:
        parts.append(_RECORD + str(message.get("role", "")) + _UNIT + _content_text(message.get("content")))
    return parts


def canonical_completion(prompt: object) -> str:
    """Serialize a completions ``prompt``: text as is, token ids as their decimal list."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(item, str) for item in prompt):
        return "".join(prompt)
    return orjson.dumps(prompt).decode()


def prefix_seed(model: str, salt: str) -> int:
    """The first link of the chain: different models or tenant salts give unrelated chains."""
    return xxhash.xxh3_64_intdigest(f"{model}{_UNIT}{salt}".encode())


def cache_seed(salt: str | None) -> int:
    """The first link for prompts a replica caches under the cache salt ``salt`` (None: no salt).

    Engines share cached prefixes between all requests with the same salt, whatever their route or tenant, so
    the salt the replica receives is all that separates chains; it is also all a replica's KV events say."""
    return prefix_seed("", salt or "")


def block_hashes(
    text: str, seed: int, *, block_chars: int = DEFAULT_BLOCK_CHARS, max_blocks: int = DEFAULT_MAX_BLOCKS
) -> list[int]:
    """Chained hashes of the full blocks of ``text`` (a trailing partial block is not a shared prefix yet)."""
    data = text.encode()
    count = min(len(data) // block_chars, max_blocks)
    return _chained(memoryview(data)[: count * block_chars], block_chars, seed)


def token_block_hashes(ids: array[int], seed: int, *, block_tokens: int, max_blocks: int) -> list[int]:
    """The same chain over blocks of ``block_tokens`` token ids (``ids`` as unsigned 32-bit integers)."""
    count = min(len(ids) // block_tokens, max_blocks)
    return _chained(memoryview(ids).cast("B")[: count * block_tokens * ids.itemsize], block_tokens * ids.itemsize, seed)


def _chained(data: memoryview, block_bytes: int, seed: int) -> list[int]:
    hashes: list[int] = []
    append = hashes.append
    digest = xxhash.xxh3_64_intdigest
    previous = seed
    # iter_unpack cuts the blocks in C: about a quarter faster than slicing bytes or a memoryview per block.
    for (block,) in struct.iter_unpack(f"{block_bytes}s", data):
        previous = digest(block, previous)
        append(previous)
    return hashes


def _content_text(content: object) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping):
                texts.append(part["text"] if isinstance(part.get("text"), str) else orjson.dumps(part).decode())
        return _UNIT.join(texts)
    return orjson.dumps(content).decode()
