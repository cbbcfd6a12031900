"""Token ids of a prompt's canonical serialization, for fingerprints in blocks of tokens.

Tokenizing costs far more than hashing (an 8k-token prompt takes ~10 ms with a Hugging Face tokenizer on one
core, against ~30 us to hash its characters), so the serialization is tokenized record by record (tool
definitions, then each message) and the ids of each record are kept in a bounded cache: a system prompt or
a conversation's earlier turns, sent again with every request, are tokenized once. The ids of a prompt are
its records' ids in order, so turn n+1's ids extend turn n's, as the characters do. Token boundaries at
the joins between records may differ from tokenizing the whole text at once; the fingerprint only needs
them to be the same every time, and they are.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import xxhash

from spillgate.cache.fingerprint import canonical_completion, canonical_records

DEFAULT_CACHE_TOKENS = 2_000_000
"""Token ids kept for repeated records: 8 MB as 32-bit integers."""


class Encoder(Protocol):
    """What is used of a ``tokenizers.Tokenizer``."""

    def encode(self, sequence: str, add_special_tokens: bool = ...) -> Any: ...


class PromptIds(Protocol):
    """A prompt's token ids, as fingerprints are cut from: this module's record-by-record ids, or the engine's own
    (:class:`~cache.template.TemplateTokenizer`, a simulator's), which KV-cache events can be matched against."""

    @property
    def exact(self) -> bool:
        """Whether these are the ids the engine caches."""
        ...

    @property
    def cached_tokens(self) -> int: ...

    def chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> array[int]: ...

    def completion(self, prompt: object) -> array[int]: ...


_NAMED: dict[str, Callable[[], PromptIds]] = {}


def register_prompt_ids(name: str, factory: Callable[[], PromptIds]) -> None:
    """Make ``prefix.tokenizer: <name>`` mean ``factory()``: for engines whose tokenizer is not a Hugging Face
    file (the simulator's), registered by a plug-in."""
    _NAMED[name] = factory


def named_prompt_ids(name: str) -> PromptIds | None:
    factory = _NAMED.get(name)
    return None if factory is None else factory()


class IdsCache:
    """Token ids of texts seen before, kept up to ``limit`` ids in all, the least recently used dropped first."""

    def __init__(self, limit: int = DEFAULT_CACHE_TOKENS) -> None:
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._limit = limit
        self.tokens = 0
        """Token ids held (at most ``limit``)."""

    def ids(self, text: str, encode: Callable[[str], Sequence[int]], *, variant: int = 0) -> array[int]:
        """``text``'s ids, from ``encode`` the first time; ``variant`` keeps apart encodings of the same text."""
        key = xxhash.xxh3_128_digest(text.encode(), seed=variant)
        entries = self._entries
        ids = entries.get(key)
        if ids is not None:
            entries.move_to_end(key)
            return ids
        ids = array("I", encode(text))
        if len(ids) <= self._limit:
            entries[key] = ids
            self.tokens += len(ids)
            while self.tokens > self._limit:
                _, evicted = entries.popitem(last=False)
                self.tokens -= len(evicted)
        return ids


class PromptTokenizer:
    """A prompt's token ids, record by record, with the ids of records seen before kept up to ``cache_tokens``."""

    exact = False
    """Records are tokenized without the chat template: stable ids for fingerprints, not the engine's."""

    def __init__(self, encoder: Encoder, *, cache_tokens: int = DEFAULT_CACHE_TOKENS) -> None:
        self._encoder = encoder
        self._cache = IdsCache(cache_tokens)

    def chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> array[int]:
        ids = array("I")
        for record in canonical_records(messages, tools):
            ids.extend(self._record(record))
        return ids

    def completion(self, prompt: object) -> array[int]:
        """A completions ``prompt``: token ids are the tokens already; text is tokenized like a record."""
        if isinstance(prompt, list) and prompt and all(_is_token_id(item) for item in prompt):
            return array("I", prompt)
        return array("I", self._record(canonical_completion(prompt)))

    @property
    def cached_tokens(self) -> int:
        """Token ids held for repeated records (at most ``cache_tokens``)."""
        return self._cache.tokens

    def _record(self, text: str) -> array[int]:
        return self._cache.ids(text, self._encode)

    def _encode(self, text: str) -> Sequence[int]:
        return self._encoder.encode(text, add_special_tokens=False).ids


def _is_token_id(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**32
