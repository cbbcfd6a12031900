"""Prompts being prefilled right now, so that a request sharing one waits for it instead of computing it again;
prompts held back while their replica has enough waiting.

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
repeated prefill. SGLang's overlap scheduler (on by default) forms each batch as the one before it starts, before
that one's results are in: the batch formed when a prefill's batch forms comes before its blocks are cached,
so a request sharing them waits one pass more, until the replica's next token shows that batch has begun.

The same model of batch formation keeps batches short. SGLang puts every waiting request into its next
prefill batch, up to ``chunked_prefill_size`` new tokens, and none of them sees its first token before the
whole batch ends: under a burst every batch is full (8k tokens, about 0.3 s for an 8B model on an H100), and
a prompt waits for the batch ahead and then for all of its own, however early in it it came. So once an eighth
of a batch of new tokens waits unscheduled at a replica (``pools[].max_waiting_prefill_tokens``), further prompts
of at least :data:`MIN_HELD_TOKENS` new tokens are held at the gateway, in order, and sent as batches form:
the prompts already waiting get a shorter batch, and a held prompt is early in the one after. Held prompts
are booked on their replica when decided, so later decisions see them queued there, and their prefix is
theirs to compute, so requests sharing it wait for them as above. The replica does not idle for it: held
prompts are sent as a batch forms, and reach the replica while that batch runs.

Streamed requests only: a whole (non-streamed) response shows its first token when it ends, far too late to
tell when its prefill did. Measured with ``tests.bench.compare_routers`` on ``gsp`` (docs/performance.md).

Gateway processes sharing Redis tell each other which new prefixes they have sent and not yet seen start
(:mod:`cache.shared_index`), so a request reaching another process waits for that prefill too: without it,
the second request of a new prompt group that lands on the other process joins the first one's batch and
computes the prefix again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BATCH_TOKENS = 8192
"""SGLang's ``chunked_prefill_size`` on an H100-class GPU, for replicas that do not say theirs."""
HOLD_BATCH_FRACTION = 8
"""By default prompts are held once an eighth of a prefill batch waits unscheduled at their replica."""
MIN_HELD_TOKENS = 512
"""A prompt with fewer new tokens is never held: it adds little to a batch, and a hit should not queue."""
WARM_SHARE = 0.25
"""A prompt whose replica holds at least this share of its prefix blocks is never held: held, it waits while other
prompts' prefills push its prefix out of the replica's cache (the same share the affinity scorer starts to
prefer a replica at)."""
REMOTE_LEAD_TTL_S = 10.0
"""How long another process's prefill is waited for without word that it started (that process may be gone): as
long as a request is ever held at the gateway (``gateway.serving.forwarding``), as for a prefill of this process.
A prompt can wait longer than 5 s in a busy replica's queue; with 5 s, on ``compare_kv_events`` gsp-zipf with two
processes, 35 of the 39 requests whose wait lapsed so were sent before the prefix was computed and computed it
again, while 28 of the 29 released by the word that it started found it cached."""


@dataclass(eq=False, slots=True)
class Lead:
    """One streamed request bound for one replica: the new prefix blocks it computes there, and when it starts."""

    replica: str
    hashes: tuple[int, ...]
    tokens: int
    """Prompt tokens it prefills (those the replica does not hold): its share of a prefill batch."""
    started: asyncio.Future[None]
    joinable: asyncio.Future[None]
    """Done once a request sent to the replica now lands in a batch formed after this prefill's results: with
    the overlap scheduler one pass after :attr:`started`, without it at the same time."""
    released: asyncio.Future[None] | None = None
    """Set when the gateway holds the request back (:meth:`PrefillsInFlight.sent`); done once it may go."""


def hold_limit(configured: int | None, batch_tokens: int) -> int:
    """Uncached tokens that may wait unscheduled at a replica before new prompts are held at the gateway:
    ``configured`` if set (0: never hold), else an eighth of the replica's prefill batch (``chunked_prefill_size``):
    about one long prompt. On ``gsp`` (seeds 0-3) it cut TTFT p99 from 350 ms at half a batch to 294 ms
    (docs/performance.md)."""
    if configured is not None:
        return configured
    return (batch_tokens or DEFAULT_BATCH_TOKENS) // HOLD_BATCH_FRACTION


class PrefillsInFlight:
    """Which prefix blocks each replica is computing right now, which of those prefills have started, and
    which prompts the gateway holds back until their replica has room.

    Holds the streamed requests held back, or sent and not yet past their first token: bounded by the requests
    in flight times the fingerprint's block cap; and other processes' announced prefills for at most
    ``remote_ttl_s`` each.
    """

    def __init__(self, *, remote_ttl_s: float = REMOTE_LEAD_TTL_S) -> None:
        self._remote_ttl_s = remote_ttl_s
        self._computing: dict[tuple[str, int], Lead] = {}
        self._pending: dict[str, dict[Lead, None]] = {}
        """Per replica, the requests sent and not past their first token, in the order they were sent."""
        self._waiting: dict[str, int] = {}
        """Per replica, the tokens of sent requests whose prefill batch has not formed yet."""
        self._held: dict[str, deque[Lead]] = {}
        """Per replica, the requests held at the gateway, in the order they came."""
        self._hold_limits: dict[str, int] = {}
        self._batch_tokens: dict[str, int] = {}
        self._batch_since: dict[str, float] = {}
        """Per replica, when its batch in progress started (``time.monotonic``)."""
        self._remote: OrderedDict[tuple[bytes, int], tuple[Lead, float]] = OrderedDict()
        """Prefills other gateway processes sent and have not seen start, with when to stop waiting for them."""
        self._expiry: asyncio.TimerHandle | None = None
        self._overlap: dict[str, bool] = {}
        """Per replica, whether it runs the overlap scheduler."""
        self._starting: dict[str, list[Lead]] = {}
        """Per overlapping replica, the leads whose batch has formed and not yet begun: joinable at its next pass."""

    def sent(
        self,
        replica: str,
        hashes: Sequence[int],
        cached_blocks: int,
        tokens: int,
        batch_tokens: int = 0,
        hold_beyond: int = 0,
        overlap: bool = False,
    ) -> Lead:
        """A request goes to ``replica`` to prefill ``tokens`` tokens, among them the blocks
        ``hashes[cached_blocks:]``; ``batch_tokens`` is the replica's prefill batch budget (0: the default).
        A block that an earlier request is computing stays that request's: it finishes first.

        With ``hold_beyond`` set, a prompt of at least :data:`MIN_HELD_TOKENS` new tokens, of whose blocks the replica
        holds under :data:`WARM_SHARE`, is held while
        ``hold_beyond`` tokens or more wait unscheduled there, or while earlier prompts are held: its
        :attr:`Lead.released` is done when it may go. SGLang puts every waiting request into the next prefill
        batch, up to ``chunked_prefill_size`` tokens, and none of them sees its first token before the whole
        batch ends; holding the rest at the gateway keeps each batch to the prompts that can start soonest.

        ``overlap``: the replica runs SGLang's overlap scheduler, which forms each batch as the one before it
        starts, before that one's results are in: a prefill's blocks are matched from the batch after next.
        """
        loop = asyncio.get_running_loop()
        lead = Lead(replica, tuple(hashes[cached_blocks:]), tokens, loop.create_future(), loop.create_future())
        self._batch_tokens[replica] = batch_tokens or DEFAULT_BATCH_TOKENS
        self._overlap[replica] = overlap
        self._claim_blocks(lead)
        held = self._held.get(replica)
        warm = bool(hashes) and cached_blocks >= WARM_SHARE * len(hashes)
        if (
            hold_beyond
            and tokens >= MIN_HELD_TOKENS
            and not warm
            and (held or self._waiting.get(replica, 0) >= hold_beyond)
        ):
            lead.released = loop.create_future()
            self._hold_limits[replica] = hold_beyond
            self._held.setdefault(replica, deque()).append(lead)
        else:
            self._enter(lead)
        return lead

    def send_now(self, lead: Lead) -> None:
        """Stop holding ``lead`` (it waited long enough): it goes now, whatever waits at its replica."""
        released = lead.released
        if released is None or released.done():
            return
        self._held[lead.replica].remove(lead)
        released.set_result(None)
        self._enter(lead)

    def running(self, replica: str) -> tuple[int, float]:
        """Tokens of ``replica``'s batch in progress (sent requests it has started and whose first tokens have not
        all come back), and when that batch started: predictions count what it has computed since as done."""
        tokens = 0
        for lead in self._pending.get(replica, ()):
            if not lead.started.done():
                break
            tokens += lead.tokens
        return tokens, self._batch_since.get(replica, 0.0)

    def held(self, replica: str) -> tuple[int, int]:
        """Tokens and count of the prompts held back for ``replica``."""
        held = self._held.get(replica, ())
        return sum(lead.tokens for lead in held), len(held)

    def ended(self, lead: Lead) -> None:
        """``lead``'s prefill is over (its first token came, or it failed): its blocks are cached or gone, and
        the replica forms its next batch from the requests still waiting."""
        replica = lead.replica
        self._release_blocks(lead)
        self.progressed(replica)
        released = lead.released
        if released is not None and not released.done():
            # Still held (its client left): it never reached the replica.
            self._held[replica].remove(lead)
            released.cancel()
            _finish(lead)
            return
        pending = self._pending.get(replica)
        if pending is not None and lead in pending:
            del pending[lead]
            if not lead.started.done():
                self._waiting[replica] -= lead.tokens
        _finish(lead)
        # Started requests come first in ``pending``; while one remains, its batch has not ended (the others'
        # first tokens are on their way). Once none does, the next batch takes the waiting requests in order
        # until the budget is spent, the one crossing it included (SGLang chunks it).
        if pending and not next(iter(pending)).started.done():
            self._batch_since[replica] = time.monotonic()
            budget = self._batch_tokens.get(replica, DEFAULT_BATCH_TOKENS)
            ahead = 0
            for other in pending:
                if ahead >= budget:
                    break
                if not other.started.done():
                    self._start(other)
                    self._waiting[replica] -= other.tokens
                ahead += other.tokens
        self._release_held(replica)

    def awaits_pass(self, replica: str) -> bool:
        """Whether a prefix on ``replica`` becomes joinable at its next pass (:meth:`progressed`)."""
        return bool(self._starting.get(replica))

    def progressed(self, replica: str) -> None:
        """A token came back from ``replica``: with the overlap scheduler, the batch formed at the last batch's end
        has begun, and the batch formed now comes after its results."""
        starting = self._starting.get(replica)
        if starting:
            for lead in starting:
                if not lead.joinable.done():
                    lead.joinable.set_result(None)
            starting.clear()

    def _start(self, lead: Lead) -> None:
        """``lead``'s prefill batch forms now."""
        lead.started.set_result(None)
        if self._overlap.get(lead.replica):
            self._starting.setdefault(lead.replica, []).append(lead)
        else:
            lead.joinable.set_result(None)

    def _enter(self, lead: Lead) -> None:
        """``lead`` reaches its replica's queue: an idle replica starts it at once, and forms its next batch at
        once too, before a request sharing the prefix can arrive."""
        pending = self._pending.setdefault(lead.replica, {})
        if not pending:
            _finish(lead)
            self._batch_since[lead.replica] = time.monotonic()
        else:
            self._waiting[lead.replica] = self._waiting.get(lead.replica, 0) + lead.tokens
        pending[lead] = None

    def _release_held(self, replica: str) -> None:
        held = self._held.get(replica)
        if not held:
            return
        limit = self._hold_limits[replica]
        while held and self._waiting.get(replica, 0) < limit:
            lead = held.popleft()
            assert lead.released is not None
            lead.released.set_result(None)
            self._enter(lead)

    def computing_elsewhere(self, origin: bytes, number: int, replica: str, hashes: Sequence[int]) -> None:
        """Gateway process ``origin`` sent a request (its ``number``) that computes the blocks ``hashes`` on
        ``replica``, and has not seen its prefill start. Blocks a request of this process computes stay that
        request's."""
        key = (origin, number)
        if key in self._remote:
            return
        loop = asyncio.get_running_loop()
        started = loop.create_future()
        lead = Lead(replica, tuple(hashes), 0, started, started)
        self._remote[key] = (lead, time.monotonic() + self._remote_ttl_s)
        self._claim_blocks(lead)
        if self._expiry is None:
            self._expiry = loop.call_later(self._remote_ttl_s, self._expire_remote)

    def started_elsewhere(self, origin: bytes, number: int) -> None:
        """The prefill :meth:`computing_elsewhere` was told of has started (or ended)."""
        entry = self._remote.pop((origin, number), None)
        if entry is not None:
            self._forget_remote(entry[0])

    def forget_elsewhere(self, origin: bytes | None = None) -> None:
        """Stop waiting for the prefills process ``origin`` announced (it stopped), or every process's (``None``:
        this process cannot hear them start any more)."""
        for key in [key for key in self._remote if origin is None or key[0] == origin]:
            self._forget_remote(self._remote.pop(key)[0])

    def _expire_remote(self) -> None:
        """Announcements never said to start lapse (their process may have died): checked on a timer, since a
        request waiting on one has nothing else to wake it."""
        self._expiry = None
        remote = self._remote
        now = time.monotonic()
        while remote:
            key, (lead, deadline) = next(iter(remote.items()))
            if deadline > now:
                self._expiry = asyncio.get_running_loop().call_later(deadline - now, self._expire_remote)
                return
            del remote[key]
            self._forget_remote(lead)

    def _forget_remote(self, lead: Lead) -> None:
        self._release_blocks(lead)
        _finish(lead)

    def _claim_blocks(self, lead: Lead) -> None:
        """``lead`` computes those of its blocks no earlier request computes."""
        computing = self._computing
        for block in lead.hashes:
            computing.setdefault((lead.replica, block), lead)

    def _release_blocks(self, lead: Lead) -> None:
        computing = self._computing
        for block in lead.hashes:
            key = (lead.replica, block)
            if computing.get(key) is lead:
                del computing[key]

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


def _finish(lead: Lead) -> None:
    """``lead`` has started and may be joined: its prefill is over, or it never reaches the replica."""
    for future in (lead.started, lead.joinable):
        if not future.done():
            future.set_result(None)
