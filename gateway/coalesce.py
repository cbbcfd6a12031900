"""Prompts being prefilled right now, so that a request sharing one waits for it instead of computing it again.

SGLang matches a prompt against its radix cache when it puts the request into a prefill batch, and a new
prefix enters the cache when the batch computing it ends. Two requests that bring the same new prefix to a
replica and land in the same batch therefore both compute it: SGLang's default first-come-first-served
schedule shares nothing within a batch. Under a burst of new prompt groups (the cold start of every
deployment, a new system prompt going live) the second and later requests of a group repeat the first one's
work, on the replica that is already the busiest, and everything queued behind them waits for it.

The gateway sends them to that same replica anyway (the prefix index records a prompt when it is
dispatched), so it knows which request computes which prefix. A request whose matched prefix is still
waiting to be computed there is held until the prefill computing it has started, then sent: it lands in a
later batch and finds the prefix cached. The gateway tells when a prefill starts the way SGLang's scheduler
decides it: a batch ends when its requests' first tokens come back, and the next one takes the waiting
requests in arrival order (its ``schedule_policy`` is ``fcfs`` by default) up to ``chunked_prefill_size``
new tokens. Held until then, a request could not have started sooner anyway; the replica is spared the
repeated prefill.

Streamed requests only: a whole (non-streamed) response shows its first token when it ends, far too late to
tell when its prefill did. Measured with ``tests.bench.compare_routers`` on ``gsp`` (README).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BATCH_TOKENS = 8192
"""SGLang's ``chunked_prefill_size`` on an H100-class GPU, for replicas that do not say theirs."""


@dataclass(eq=False, slots=True)
class Lead:
    """One streamed request sent to one replica: the new prefix blocks it computes there, and when it starts."""

    replica: str
    hashes: tuple[int, ...]
    tokens: int
    """Prompt tokens it prefills (those the replica does not hold): its share of a prefill batch."""
    started: asyncio.Future[None]


class PrefillsInFlight:
    """Which prefix blocks each replica is computing right now, and which of those prefills have started.

    Holds the streamed requests sent and not yet past their first token: bounded by the requests in flight
    times the fingerprint's block cap.
    """

    def __init__(self) -> None:
        self._computing: dict[tuple[str, int], Lead] = {}
        self._pending: dict[str, dict[Lead, None]] = {}
        """Per replica, the requests not past their first token, in the order they were sent."""
        self._batch_tokens: dict[str, int] = {}

    def sent(self, replica: str, hashes: Sequence[int], cached_blocks: int, tokens: int, batch_tokens: int = 0) -> Lead:
        """A request goes to ``replica`` to prefill ``tokens`` tokens, among them the blocks
        ``hashes[cached_blocks:]``; ``batch_tokens`` is the replica's prefill batch budget (0: the default).
        A block that an earlier request is computing stays that request's: it finishes first."""
        lead = Lead(replica, tuple(hashes[cached_blocks:]), tokens, asyncio.get_running_loop().create_future())
        pending = self._pending.setdefault(replica, {})
        if not pending:
            lead.started.set_result(None)  # an idle replica starts it at once
        pending[lead] = None
        self._batch_tokens[replica] = batch_tokens or DEFAULT_BATCH_TOKENS
        computing = self._computing
        for block in lead.hashes:
            computing.setdefault((replica, block), lead)
        return lead

    def ended(self, lead: Lead) -> None:
        """``lead``'s prefill is over (its first token came, or it failed): its blocks are cached or gone, and
        the replica forms its next batch from the requests still waiting."""
        replica = lead.replica
        computing = self._computing
        for block in lead.hashes:
            key = (replica, block)
            if computing.get(key) is lead:
                del computing[key]
        if not lead.started.done():
            lead.started.set_result(None)
        pending = self._pending.get(replica)
        if pending is None:
            return
        pending.pop(lead, None)
        # Started requests come first in ``pending``; while one remains, its batch has not ended (the others'
        # first tokens are on their way). Once none does, the next batch takes the waiting requests in order
        # until the budget is spent, the one crossing it included (SGLang chunks it).
        if not pending or next(iter(pending)).started.done():
            return
        budget = self._batch_tokens.get(replica, DEFAULT_BATCH_TOKENS)
        ahead = 0
        for other in pending:
            if ahead >= budget:
                break
            if not other.started.done():
                other.started.set_result(None)
            ahead += other.tokens

    def computing(self, replica: str, hashes: Sequence[int], matched_blocks: int) -> tuple[Lead | None, int]:
        """The request computing the end of a match of ``matched_blocks`` blocks on ``replica``, and how many of
        the matched blocks it computes; ``(None, 0)`` when the whole match is cached already."""
        if matched_blocks <= 0:
            return None, 0
        lead = self._computing.get((replica, hashes[matched_blocks - 1]))
        if lead is None:
            return None, 0
        count = 1
        while count < matched_blocks and self._computing.get((replica, hashes[matched_blocks - 1 - count])) is lead:
            count += 1
        return lead, count

    def __len__(self) -> int:
        return len(self._computing)
