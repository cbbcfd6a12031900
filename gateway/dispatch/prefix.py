"""Prefix-cache awareness for the gateway: fingerprint a request, ask the index, keep the index honest.

The index is told about a request when it is dispatched (the replica will hold its prompt once prefill
runs) and corrected by what the replica reports afterwards: fewer ``cached_tokens`` than predicted means
the replica keeps less than we believed, so its believed capacity shrinks and the oldest entries go; a
failed request's new entries are withdrawn; a restarted replica starts empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from spillgate.cache.fingerprint import (
    block_hashes,
    canonical_chat,
    canonical_completion,
    prefix_seed,
    token_block_hashes,
)
from spillgate.cache.index import PrefixIndex
from spillgate.cache.shared_index import SharedPrefixIndex
from spillgate.cache.tokens import PromptTokenizer
from spillgate.gateway.dispatch.coalesce import Lead
from spillgate.gateway.serving.validation import CHARS_PER_TOKEN

_BLOCK_SLACK = 1
"""Blocks of disagreement tolerated before a report counts as a miss (templates add a few tokens)."""


@dataclass(frozen=True, slots=True)
class Fingerprint:
    hashes: tuple[int, ...]
    prefix_key: int
    length: int
    """The serialized prompt's length in the unit blocks are cut in: characters, or tokens with a tokenizer."""


class PrefixTracker:
    """Fingerprints prompts in blocks of ``block_chars`` characters or, given a ``tokenizer``, of
    ``block_tokens`` tokens, and keeps the prefix index in step with what replicas report."""

    def __init__(
        self,
        *,
        block_chars: int,
        max_blocks: int,
        tokenizer: PromptTokenizer | None = None,
        block_tokens: int = 64,
    ) -> None:
        self.index = PrefixIndex()
        self.shared: SharedPrefixIndex | None = None
        """Set when the index is shared with other gateway processes through Redis."""
        self.tokenizer = tokenizer
        self._block_size = block_chars if tokenizer is None else block_tokens
        self._max_blocks = max_blocks

    @property
    def tokens_per_block(self) -> int:
        if self.tokenizer is not None:
            return self._block_size
        return max(1, self._block_size // CHARS_PER_TOKEN)

    def capacity_known(self, replica: str, max_total_tokens: int) -> None:
        """Size a replica's index from its KV capacity in tokens (``max_total_num_tokens``)."""
        self.index.set_capacity(replica, max_total_tokens // self.tokens_per_block)

    def fingerprint(self, payload: Mapping[str, Any], *, chat: bool, model: str, salt: str) -> Fingerprint:
        if self.tokenizer is not None:
            return self._token_fingerprint(payload, chat=chat, seed=prefix_seed(model, salt))
        if chat:
            text = canonical_chat(payload["messages"], payload.get("tools"))
        else:
            text = canonical_completion(payload["prompt"])
        seed = prefix_seed(model, salt)
        block = self._block_size
        hashes = block_hashes(text, seed, block_chars=block, max_blocks=self._max_blocks)
        # Prompts shorter than a block still get a stable key for prefix-affine hashing.
        key = hashes[0] if hashes else block_hashes(text.ljust(block, "\0"), seed, block_chars=block)[0]
        return Fingerprint(tuple(hashes), key, len(text))

    def _token_fingerprint(self, payload: Mapping[str, Any], *, chat: bool, seed: int) -> Fingerprint:
        assert self.tokenizer is not None
        if chat:
            ids = self.tokenizer.chat(payload["messages"], payload.get("tools"))
        else:
            ids = self.tokenizer.completion(payload["prompt"])
        hashes = token_block_hashes(ids, seed, block_tokens=self._block_size, max_blocks=self._max_blocks)
        key = hashes[0] if hashes else xxhash.xxh3_64_intdigest(ids.tobytes(), seed)
        return Fingerprint(tuple(hashes), key, len(ids))

    def matched_blocks(self, fingerprint: Fingerprint, replicas: Iterable[str]) -> dict[str, int]:
        return self.index.match(fingerprint.hashes, replicas)

    def dispatched(self, replica: str, fingerprint: Fingerprint) -> None:
        """``replica`` will hold this prompt once prefilled; hosted backends have no cache we track."""
        if not self.index.knows(replica):
            return
        self.index.insert(replica, fingerprint.hashes)
        if self.shared is not None:
            self.shared.publish("insert", replica, fingerprint.hashes)

    def announce(self, replica: str, lead: Lead) -> None:
        """``lead`` was sent to ``replica`` (or is held for it) and computes new blocks there once its prefill batch
        forms: tell the other gateway processes, so that their requests sharing those blocks wait for it
        (:mod:`gateway.dispatch.coalesce`)."""
        shared = self.shared
        joinable = lead.joinable
        if shared is None or joinable.done() or not lead.hashes:
            return
        number = shared.announce(replica, lead.hashes)
        if number is not None:
            joinable.add_done_callback(lambda _: shared.announce_started(replica, number))

    def failed(self, replica: str, fingerprint: Fingerprint, predicted_blocks: int) -> None:
        """Nothing was prefilled: withdraw what :meth:`dispatched` added beyond what was already there."""
        self.index.forget_after(replica, fingerprint.hashes, predicted_blocks)
        if self.shared is not None:
            self.shared.publish("forget", replica, fingerprint.hashes, predicted_blocks)

    def observed(self, replica: str, fingerprint: Fingerprint, predicted_blocks: int, usage: Mapping[str, Any]) -> None:
        """Compare the replica's ``cached_tokens`` with the prediction and adjust what we believe it keeps."""
        prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        if not isinstance(prompt_tokens, int) or not isinstance(cached, int) or prompt_tokens <= 0:
            return  # the backend does not report cache hits (SGLang without --enable-cache-report)
        real_blocks = int(cached / prompt_tokens * fingerprint.length) // self._block_size
        if real_blocks + _BLOCK_SLACK < predicted_blocks:
            self.index.penalize(replica)
        elif predicted_blocks:
            self.index.reward(replica)

    def removed(self, replica: str) -> None:
        """The replica left the config, or its name now belongs to another address: forget it entirely."""
        self.index.remove(replica)

    def restarted(self, replica: str) -> None:
        """The replica is a new process (it refused connections, or its counters started again): its cache is gone."""
        self.index.clear(replica)
        if self.shared is not None:
            self.shared.publish("clear", replica)
