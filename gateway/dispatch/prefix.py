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

A data-parallel replica keeps one KV cache per rank, each publishing its own events: each rank has its own record
(:func:`rank_record`). The replica's match is its best rank's, and the request is sent to that rank
(:mod:`policies.dp_rank`, among equal ranks the least loaded by this gateway's requests there); a rank whose
record catches up counts as holding nothing meanwhile, and the belief, which cannot tell ranks apart, is matched
only while every rank catches up.
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
from spillgate.policies.dp_rank import choose_rank

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
    rank_depths: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, hash=False)
    """For data-parallel replicas matched on their events: the leading blocks each rank holds, from which
    :meth:`PrefixTracker.dispatched` picks the rank."""


def rank_record(replica: str, rank: int) -> str:
    """The name one data-parallel rank's record goes by in the engine index and the recent sends: the replica's
    own for rank 0 (the only one of a replica without data parallelism), ``replica#rank`` for the others (no
    replica's name holds a ``#``)."""
    return replica if rank == 0 else f"{replica}#{rank}"


def _replica_of(record: str) -> str:
    return record.partition("#")[0]


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
        self._ranks: dict[str, tuple[str, ...]] = {}
        """Replicas whose events are followed -> their ranks' records (:func:`rank_record`), one without data
        parallelism."""
        self._fed: dict[str, bool] = {}
        """Each followed rank's record -> whether it is complete."""
        self._behind: set[str] = set()
        """Records catching up (:meth:`catching_up`): a replica whose every rank catches up is matched on the
        belief meanwhile."""
        self._outstanding: dict[str, list[int]] = {}
        """Data-parallel replicas -> this process's requests in flight at each rank (:meth:`dispatched`)."""
        self._turns: dict[str, int] = {}
        """Data-parallel replicas -> the rank preferred first among equals, moved past each one chosen."""
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
        ranks, behind = self._ranks, self._behind
        if ranks and self.exact is not None:
            followed = [name for name in depths if name in ranks]
            records = [record for name in followed for record in ranks[name] if record not in behind]
            if records:
                exact = self.exact.match(hashes, records)
                recent = self.recent.match(hashes, records)
                whole = self.exact.in_whole_engine_blocks
                fed = self._fed
                for name in followed:
                    own = ranks[name]
                    if len(own) == 1:
                        if name in behind:
                            continue
                        depth = max(exact[name], whole(name, recent.get(name, 0)))
                        fingerprint.unused_belief[name] = depths[name]
                        depths[name] = depth if fed[name] else max(depth, depths[name])
                        continue
                    per_rank = tuple(
                        0 if record in behind else max(exact[record], whole(record, recent.get(record, 0)))
                        for record in own
                    )
                    fingerprint.rank_depths[name] = per_rank
                    if any(record not in behind for record in own):
                        fingerprint.unused_belief[name] = depths[name]
                        depths[name] = max(per_rank)
        return depths

    def source(self, replica: str) -> str:
        """What the replica's prediction comes from: ``events``, ``events+belief`` (incomplete events, or some
        ranks catching up) or ``belief``."""
        own = self._ranks.get(replica)
        if own is None:
            return "belief"
        caught_up = [record not in self._behind for record in own]
        if not any(caught_up):
            return "belief"
        return "events" if all(caught_up) and all(self._fed[record] for record in own) else "events+belief"

    def ranks(self, replica: str) -> int:
        """Data-parallel ranks of ``replica`` whose events are followed; 0 when none are."""
        return len(self._ranks.get(replica, ()))

    def outstanding(self, replica: str) -> list[int]:
        """This process's requests in flight at each rank of a data-parallel replica (``[]`` for others)."""
        return list(self._outstanding.get(replica, ()))

    # KV-cache events (:class:`~backends.kv_subscriber.KvEventSink`), named by each rank's record -----

    def follow(self, replica: str, ranks: int = 1) -> None:
        """Events of ``replica``'s ``ranks`` data-parallel ranks are followed from now on; each rank's record
        (:func:`rank_record`) starts empty, incomplete and behind."""
        exact = self.exact
        if exact is None or self.ranks(replica) == ranks:
            return
        self.unfollow(replica)
        records = tuple(rank_record(replica, rank) for rank in range(ranks))
        self._ranks[replica] = records
        for record in records:
            exact.add(record)
            self._fed[record] = False
            self._behind.add(record)
        if ranks > 1:
            self._outstanding[replica] = [0] * ranks
            self._turns[replica] = 0

    def unfollow(self, replica: str) -> None:
        records = self._ranks.pop(replica, ())
        for record in records:
            self._behind.discard(record)
            del self._fed[record]
            if self.exact is not None:
                self.exact.remove(record)
            if record != replica:
                self.recent.forget(record)
        self._outstanding.pop(replica, None)
        self._turns.pop(replica, None)

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
            self.index.clear(_replica_of(replica))
            self.recent.forget(replica)

    # Requests -------------------------------------------------------------------------------------

    def sent_elsewhere(self, replica: str, hashes: Sequence[int], rank: int = 0) -> None:
        """Another gateway process sent ``replica`` (its data-parallel rank ``rank``) these blocks: until the
        replica's events tell, count them as this process counts its own, so two processes do not place one new
        prefix on two replicas."""
        own = self._ranks.get(replica)
        if own is not None and 0 <= rank < len(own):
            self.recent.sent(own[rank], hashes)

    def dispatched(self, replica: str, fingerprint: Fingerprint) -> int | None:
        """``replica`` will hold this prompt once prefilled; hosted backends have no cache we track. Returns the
        data-parallel rank it is to be sent to (None for a replica without data parallelism followed): to be
        told to the replica, and to :meth:`settled` when the request ends."""
        own = self._ranks.get(replica)
        rank = self._choose_rank(replica, fingerprint) if own is not None and len(own) > 1 else None
        if not self.index.knows(replica):
            return rank
        if own is not None:
            self.recent.sent(own[rank or 0], fingerprint.hashes)
        self.index.insert(replica, fingerprint.hashes)
        if self.shared is not None:
            self.shared.publish("insert", replica, fingerprint.hashes, rank or 0)
        return rank

    def settled(self, replica: str, rank: int) -> None:
        """A request :meth:`dispatched` to ``rank`` of ``replica`` ended, however."""
        counts = self._outstanding.get(replica)
        if counts is not None and rank < len(counts) and counts[rank] > 0:
            counts[rank] -= 1

    def _choose_rank(self, replica: str, fingerprint: Fingerprint) -> int:
        counts = self._outstanding[replica]
        depths = fingerprint.rank_depths.get(replica)
        if depths is None or len(depths) != len(counts):
            depths = (0,) * len(counts)  # nothing matched on the ranks' events: by load, then in turn
        rank = choose_rank(depths, counts, self._turns[replica])
        self._turns[replica] = rank + 1
        counts[rank] += 1
        return rank

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
        """The replica is a new process (it refused connections, or its counters started again): its cache is gone,
        every rank's."""
        self.index.clear(replica)
        self.recent.forget(replica)
        for record in self._ranks.get(replica, ()):
            self.recent.forget(record)
            if self.exact is not None:
                # Also for a replica followed by its events: vLLM publishes nothing until the new process stores
                # its first blocks, and a request decided before then must not count on the old process's cache.
                # A probe noticing the restart late may drop the new process's first blocks: an
                # under-prediction until they are stored again, never an over-prediction.
                self.exact.clear(record)
        if self.shared is not None:
            self.shared.publish("clear", replica)
