"""Prompts being prefilled right now, so that a request sharing one waits for it instead of computing it again.

SGLang matches a prompt against its radix cache when it puts the request into a prefill batch, and a new
prefix enters the cache when the batch computing it ends. Two requests that bring the same new prefix to a
replica and land in the same batch therefore both compute it: SGLang's default first-come-first-served
schedule shares nothing within a batch. Under a burst of new prompt groups (the cold start of every
deployment, a new system prompt going live) the second and later requests of a group repeat the first one's
work, on the replica that is already the busiest, and everything queued behind them waits for it.

The gateway sends them to that same replica anyway (the prefix index records a prompt when it is
dispatched), so it knows which request computes which prefix. A request whose matched prefix is still being
computed there is held until the request computing it has started its prefill, which the gateway sees when
every request sent to that replica before it has had its first token (SGLang serves prefills in arrival
order); sent then, it lands in the next batch and finds the prefix cached. It loses almost nothing, since it
could not have started before that batch anyway, and the replica is spared the repeated prefill.

Streamed requests only: a whole (non-streamed) response shows its first token when it ends, far too late to
tell when its prefill did. Measured with ``tests.bench.compare_routers`` on ``gsp`` (README): no prefix is
computed twice any more, and the TTFT p99 over four seeds fell from 522 to 409 ms (sglang-router: 565).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lead:
    """One request sent to one replica, and the new prefix blocks it computes there."""

    replica: str
    hashes: tuple[int, ...]
    ahead: int
    """Requests sent to the replica before this one: its prefill has started once that many have ended."""
    started: asyncio.Future[None]


class PrefillsInFlight:
    """Which prefix blocks each replica is computing right now, and when each of those prefills starts.

    Holds the new blocks of the requests sent and not yet past their first token: bounded by the requests in
    flight times the fingerprint's block cap.
    """

    def __init__(self) -> None:
        self._computing: dict[tuple[str, int], Lead] = {}
        self._sent: dict[str, int] = {}
        self._ended: dict[str, int] = {}
        self._waiting: dict[str, deque[Lead]] = {}

    def sent(self, replica: str, hashes: Sequence[int], cached_blocks: int) -> Lead:
        """A request goes to ``replica``, to compute ``hashes[cached_blocks:]`` (every request counts, so that
        each lead knows how many are ahead of it). A block that an earlier request is computing stays that
        request's: it finishes first."""
        ahead = self._sent.get(replica, 0)
        self._sent[replica] = ahead + 1
        lead = Lead(replica, tuple(hashes[cached_blocks:]), ahead, asyncio.get_running_loop().create_future())
        if ahead <= self._ended.get(replica, 0):
            lead.started.set_result(None)
        else:
            self._waiting.setdefault(replica, deque()).append(lead)
        computing = self._computing
        for block in lead.hashes:
            computing.setdefault((replica, block), lead)
        return lead

    def ended(self, lead: Lead) -> None:
        """``lead``'s prefill is over (its first token came, or it failed): its blocks are cached or gone, and
        the requests sent after it are one step closer to their own prefill."""
        replica = lead.replica
        computing = self._computing
        for block in lead.hashes:
            key = (replica, block)
            if computing.get(key) is lead:
                del computing[key]
        ended = self._ended[replica] = self._ended.get(replica, 0) + 1
        waiting = self._waiting.get(replica)
        while waiting and waiting[0].ahead <= ended:
            started = waiting.popleft().started
            if not started.done():
                started.set_result(None)
        if not lead.started.done():  # ended out of order (a failure): nothing waits on it any more
            lead.started.set_result(None)

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
