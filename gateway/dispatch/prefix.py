"""Prefix-cache awareness for the gateway: fingerprint a request, ask the index, keep the index honest.

Two sources say what a replica holds. Where the replica publishes KV-cache events and the gateway knows the
engine's token ids (``prefix.tokenizer`` names the model, or ``simulated``), its own events do
(:class:`~cache.engine_index.EngineBlockIndex`), plus what it was sent in the last seconds, before its events
can tell (:class:`~cache.recent.RecentlySent`). Elsewhere the *belief* does: the index is told about a request
when it is dispatched (the replica will hold its prompt once prefill runs) and corrected by what the replica
reports afterwards: fewer ``cached_tokens`` than predicted means the replica keeps less than we believed, so
its believed capacity shrinks and the oldest entries go; a failed request's new entries are withdrawn; a
restarted replica starts empty. A replica whose events are incomplete (the gateway started listening after
it had cached things, events were lost and cannot be replayed) is matched on both, the longer match winning. A
replica whose record is catching up (replaying the engine's history, which passes through what it held minutes
ago) is matched on the belief alone until its record shows the present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from spillgate.cache.engine_index import EngineBlockIndex
from spillgate.cache.fingerprint import (
    block_hashes,
    cache_seed,
    canonical_chat,
    canonical_completion,
    token_block_hashes,
)
from spillgate.cache.index import PrefixIndex
from spillgate.cache.kv_events import AllCleared, BlocksRemoved, BlocksStored, EventBatch
from spillgate.cache.recent import RecentlySent
from spillgate.cache.shared_index import SharedPrefixIndex
from spillgate.cache.tokens import PromptIds
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
    unused_belief: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    """For replicas matched on their events: what the belief would have predicted, to count how it would have
    fared (``belief_unused`` in the prediction counts)."""


class PrefixTracker:
    """Fingerprints prompts in blocks of ``block_chars`` characters or, given a ``tokenizer``, of
    ``block_tokens`` tokens, and keeps the prefix index in step with what replicas report."""

    def __init__(
        self,
        *,
        block_chars: int,
        max_blocks: int,
        tokenizer: PromptIds | None = None,
        block_tokens: int = 64,
    ) -> None:
        self.index = PrefixIndex()
        self.shared: SharedPrefixIndex | None = None
        """Set when the index is shared with other gateway processes through Redis."""
        self.tokenizer = tokenizer
        self._block_size = block_chars if tokenizer is None else block_tokens
        self._max_blocks = max_blocks
        self.exact: EngineBlockIndex | None = (
            EngineBlockIndex(block_tokens) if tokenizer is not None and tokenizer.exact else None
        )
        """What replicas hold by their own KV-cache events; None unless prompts are cut into the engine's ids."""
        self.recent = RecentlySent()
        self._fed: dict[str, bool] = {}
        """Replicas whose events are followed -> whether their record is complete."""
        self._behind: set[str] = set()
        """Followed replicas whose record is catching up (:meth:`catching_up`): matched on the belief meanwhile."""
        self.predictions: dict[tuple[str, str, str], int] = {}
        """(replica, source, outcome) -> requests: how predicted cached blocks compared with the replica's report."""

    @property
    def tokens_per_block(self) -> int:
        if self.tokenizer is not None:
            return self._block_size
        return max(1, self._block_size // CHARS_PER_TOKEN)

    def capacity_known(self, replica: str, max_total_tokens: int) -> None:
        """Size a replica's index from its KV capacity in tokens (``max_total_num_tokens``)."""
        self.index.set_capacity(replica, max_total_tokens // self.tokens_per_block)

    def fingerprint(self, payload: Mapping[str, Any], *, chat: bool, salt: str | None) -> Fingerprint:
        """Cut the prompt into chained blocks; ``salt`` is the cache salt the replica will get, which is all that
        separates what engines share (:func:`~cache.fingerprint.cache_seed`)."""
        seed = cache_seed(salt)
        if self.tokenizer is not None:
            return self._token_fingerprint(payload, chat=chat, seed=seed)
        if chat:
            text = canonical_chat(payload["messages"], payload.get("tools"))
        else:
            text = canonical_completion(payload["prompt"])
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
        hashes = fingerprint.hashes
        depths = self.index.match(hashes, replicas)
        fed, behind = self._fed, self._behind
        if fed and self.exact is not None:
            followed = [name for name in depths if name in fed and name not in behind]
            if followed:
                exact = self.exact.match(hashes, followed)
                recent = self.recent.match(hashes, followed)
                for name in followed:
                    depth = max(exact[name], self.exact.in_whole_engine_blocks(name, recent.get(name, 0)))
                    fingerprint.unused_belief[name] = depths[name]
                    depths[name] = depth if fed[name] else max(depth, depths[name])
        return depths

    def source(self, replica: str) -> str:
        """What the replica's prediction comes from: ``events``, ``events+belief`` (incomplete events) or ``belief``."""
        complete = self._fed.get(replica)
        if complete is None or replica in self._behind:
            return "belief"
        return "events" if complete else "events+belief"

    # KV-cache events (:class:`~backends.kv_subscriber.KvEventSink`) -------------------------------

    def follow(self, replica: str) -> None:
        """Events of ``replica`` are followed from now on; its record starts empty, incomplete and behind."""
        if self.exact is not None and replica not in self._fed:
            self.exact.add(replica)
            self._fed[replica] = False
            self._behind.add(replica)

    def unfollow(self, replica: str) -> None:
        self._behind.discard(replica)
        if self._fed.pop(replica, None) is not None and self.exact is not None:
            self.exact.remove(replica)

    def catching_up(self, replica: str, behind: bool) -> None:
        """While a replay runs, the record goes through the replica's past: a prefix it held and evicted minutes
        ago shows as held, and one it holds now is missing until the batches queued behind the replay are in.
        Routing on that sent requests where their prefix had been (on ``compare_kv_events`` gsp-zipf, two fresh
        processes replaying four earlier runs did so for the first 5-11 s of a 22 s run), so the belief stands in."""
        if replica not in self._fed:
            return
        if behind:
            self._behind.add(replica)
        else:
            self._behind.discard(replica)

    def apply(self, replica: str, batch: EventBatch) -> None:
        exact = self.exact
        if exact is None or replica not in self._fed:
            return
        for event in batch.events:
            if isinstance(event, BlocksStored):
                blocks = exact.stored(replica, event)
                if blocks is None:
                    self._fed[replica] = False  # a block whose ancestry was missed: the record is incomplete
                else:
                    self.recent.settled(replica, blocks)
            elif isinstance(event, BlocksRemoved):
                self.recent.settled(replica, exact.removed(replica, event.hashes))
            elif isinstance(event, AllCleared):
                exact.clear(replica)

    def reset(self, replica: str, *, complete: bool) -> None:
        if self.exact is None or replica not in self._fed:
            return
        self.exact.clear(replica)
        self._fed[replica] = complete
        if complete:  # a new process: the belief about the old one is wrong too
            self.index.clear(replica)
            self.recent.forget(replica)

    # Requests -------------------------------------------------------------------------------------

    def sent_elsewhere(self, replica: str, hashes: Sequence[int]) -> None:
        """Another gateway process sent ``replica`` these blocks: until the replica's events tell, count them as
        this process counts its own, so two processes do not place one new prefix on two replicas."""
        if replica in self._fed:
            self.recent.sent(replica, hashes)

    def dispatched(self, replica: str, fingerprint: Fingerprint) -> None:
        """``replica`` will hold this prompt once prefilled; hosted backends have no cache we track."""
        if not self.index.knows(replica):
            return
        if replica in self._fed:
            self.recent.sent(replica, fingerprint.hashes)
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
        if self.tokenizer is not None:
            self._count_prediction(replica, self.source(replica), predicted_blocks, cached, fingerprint.length)
            unused = fingerprint.unused_belief.get(replica)
            if unused is not None:
                self._count_prediction(replica, "belief_unused", unused, cached, fingerprint.length)
        if real_blocks + _BLOCK_SLACK < predicted_blocks:
            self.index.penalize(replica)
        elif predicted_blocks:
            self.index.reward(replica)

    def _count_prediction(self, replica: str, source: str, predicted: int, cached: int, prompt_tokens: int) -> None:
        """Compare in whole gateway blocks; an engine never reuses a prompt's last token, so neither do we."""
        block = self._block_size
        predicted = min(predicted, max(0, prompt_tokens - 1) // block)
        real = min(cached, max(0, prompt_tokens - 1)) // block
        outcome = "exact" if predicted == real else "over" if predicted > real else "under"
        key = (replica, source, outcome)
        self.predictions[key] = self.predictions.get(key, 0) + 1

    def prediction_counts(self, replica: str) -> dict[str, dict[str, int]]:
        """Per source, how often the predicted cached blocks were ``exact``, ``over`` or ``under`` the replica's."""
        counts: dict[str, dict[str, int]] = {}
        for (name, source, outcome), count in self.predictions.items():
            if name == replica:
                counts.setdefault(source, {})[outcome] = count
        return counts

    def removed(self, replica: str) -> None:
        """The replica left the config, or its name now belongs to another address: forget it entirely."""
        self.index.remove(replica)
        self.recent.forget(replica)
        self.unfollow(replica)
        for key in [key for key in self.predictions if key[0] == replica]:
            del self.predictions[key]

    def restarted(self, replica: str) -> None:
        """The replica is a new process (it refused connections, or its counters started again): its cache is gone."""
        self.index.clear(replica)
        self.recent.forget(replica)
        if replica in self._fed and self.exact is not None:
            # Also for a replica followed by its events: vLLM publishes nothing until the new process stores its
            # first blocks, and a request decided before then must not count on the old process's cache. A
            # probe noticing the restart late may drop the new process's first blocks: an under-prediction
            # until they are stored again, never an over-prediction.
            self.exact.clear(replica)
        if self.shared is not None:
            self.shared.publish("clear", replica)
