"""A request's load on one backend, from the moment it is booked there until it settles: the dispatch ticket.

The ticket is the only writer of this process's load on a backend (:class:`~backends.load.OwnLoad`): requests in
flight, output tokens outstanding, uncached prompt tokens pending, the prefill batch under way, and what the
replica's prefill rate learns at each first token. Serving code books one per attempt and then only tells it events
(its turn to be sent, the first token, text, the usage reported, done); leaving its ``with`` block settles whatever
was booked, however the attempt ended (an error, a fallback, a client that went away and cancelled the task).

Prompts whose prefill order the gateway follows (streams to a replica, :mod:`gateway.dispatch.coalesce`) also
take a place in that order: a ticket may be held before it is sent, and its first token ends its prefill.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from spillgate.backends.backend import Backend
from spillgate.gateway.dispatch.coalesce import Lead, PrefillsInFlight, hold_limit
from spillgate.gateway.dispatch.prefix import Fingerprint, PrefixTracker

ASSUMED_OUTPUT_TOKENS = 256
"""Output length booked for a request that sets no max_tokens."""
SHARED_PREFILL_MIN_TOKENS = 256
"""A prefill of fewer shared tokens than this is not worth waiting for: computing them again costs less."""


class Dispatcher:
    """Books requests on backends: what every ticket shares (the prefill order, the prefix index)."""

    __slots__ = ("prefilling", "prefix")

    def __init__(self, prefilling: PrefillsInFlight, prefix: PrefixTracker) -> None:
        self.prefilling = prefilling
        self.prefix = prefix

    def book(
        self,
        backend: Backend,
        *,
        prompt_tokens: int,
        output_tokens: int | None,
        fingerprint: Fingerprint | None,
        matched_blocks: Mapping[str, int],
        prefix_tokens: Mapping[str, int],
        prefill_order: bool,
        may_hold: bool,
        started: float,
    ) -> DispatchTicket:
        """A ticket for one attempt on ``backend``; nothing is counted until its ``with`` block is entered.

        ``prefill_order``: follow the prompt's prefill there (a stream to a replica, whose first token shows
        its prefill done). ``may_hold``: it may be held back while the replica has prompts enough waiting.
        ``started``: when the request arrived (``perf_counter``), for what its first token teaches."""
        return DispatchTicket(
            self,
            backend,
            output_tokens=ASSUMED_OUTPUT_TOKENS if output_tokens is None else output_tokens,
            fingerprint=fingerprint,
            matched_blocks=matched_blocks.get(backend.name, 0),
            uncached=max(0, prompt_tokens - prefix_tokens.get(backend.name, 0)),
            prefill_order=prefill_order,
            may_hold=may_hold,
            started=started,
        )

    def shared_prefill(
        self, backend: Backend, fingerprint: Fingerprint | None, matched_blocks: Mapping[str, int]
    ) -> asyncio.Future[None] | None:
        """What to wait for before booking on ``backend``: a request sent earlier that will compute this one's
        prefix there but has not started (when it has, this one lands in a later batch and finds the prefix
        cached). None when there is nothing worth waiting for."""
        if fingerprint is None:
            return None
        lead, blocks = self.prefilling.computing(backend.name, fingerprint.hashes, matched_blocks.get(backend.name, 0))
        if lead is None or lead.joinable.done() or blocks * self.prefix.tokens_per_block < SHARED_PREFILL_MIN_TOKENS:
            return None
        return lead.joinable


class DispatchTicket:
    """One attempt's load on one backend. Enter to book it, tell it what happens, leave to settle it."""

    __slots__ = (
        "_dispatcher",
        "_fingerprint",
        "_matched_blocks",
        "_may_hold",
        "_prefill_order",
        "_started",
        "_streamed_text",
        "backend",
        "dp_rank",
        "first_token_at",
        "lead",
        "output_tokens",
        "prefill_ahead",
        "sent_at",
        "sent_to_busy",
        "uncached",
        "usage",
    )

    def __init__(
        self,
        dispatcher: Dispatcher,
        backend: Backend,
        *,
        output_tokens: int,
        fingerprint: Fingerprint | None,
        matched_blocks: int,
        uncached: int,
        prefill_order: bool,
        may_hold: bool,
        started: float,
    ) -> None:
        self._dispatcher = dispatcher
        self.backend = backend
        self.output_tokens = output_tokens
        """Output tokens booked here until the attempt ends."""
        self._fingerprint = fingerprint
        self._matched_blocks = matched_blocks
        self.uncached = uncached
        """Uncached prompt tokens booked here until the first token arrives."""
        self._prefill_order = prefill_order
        self._may_hold = may_hold
        self._started = started
        self._streamed_text = False
        self.lead: Lead | None = None
        """This prompt's place in the replica's prefill order and the new prefix blocks it computes there."""
        self.sent_at = 0.0
        self.prefill_ahead: int | None = None
        """Uncached prompt tokens the gateway had in prefill here when this was sent, so its TTFT measures prefill
        speed: ``(prefill_ahead + uncached) / rate``. ``None`` when every running slot here was taken, since the
        wait then included other requests' decoding."""
        self.sent_to_busy = False
        self.first_token_at = 0.0
        self.usage: Mapping[str, Any] | None = None
        self.dp_rank: int | None = None
        """The data-parallel rank of the replica the request is sent to, chosen by its ranks' caches; None for a
        replica without data parallelism followed (its engine picks)."""

    # -- booking and settling

    def __enter__(self) -> DispatchTicket:
        """Count the request here before it is sent, so concurrent decisions see it (also while it is held back,
        since it goes ahead of the requests decided after it)."""
        backend, own, peers = self.backend, self.backend.own, self.backend.peers
        self._mark_sent(own.pending_prefill_tokens + peers.pending_prefill_tokens, own.in_flight + peers.in_flight)
        own.in_flight += 1
        own.sent_total += 1
        own.outstanding_tokens += self.output_tokens
        own.pending_prefill_tokens += self.uncached
        prefix, fingerprint = self._dispatcher.prefix, self._fingerprint
        if fingerprint is not None:
            self.dp_rank = prefix.dispatched(backend.name, fingerprint)
        if self._prefill_order:
            # Streams only: a whole response shows its first token at the end, long after its prefill.
            self.lead = self._dispatcher.prefilling.sent(
                backend.name,
                fingerprint.hashes if fingerprint is not None else (),
                self._matched_blocks,
                self.uncached,
                backend.prefill_batch_tokens,
                hold_limit(backend.max_waiting_prefill, backend.prefill_batch_tokens) if self._may_hold else 0,
                backend.info is not None and backend.info.overlap_schedule,
            )
            prefix.announce(backend.name, self.lead)
            self._track_batch()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        """Undo the booking and feed what the backend reported back into the prefix index."""
        own = self.backend.own
        own.in_flight -= 1
        own.outstanding_tokens -= self.output_tokens
        self._end_prefill()
        if self.usage is not None:
            self.backend.observe_usage(self.usage)
        fingerprint = self._fingerprint
        if fingerprint is None:
            return
        prefix, name = self._dispatcher.prefix, self.backend.name
        if self.dp_rank is not None:
            prefix.settled(name, self.dp_rank)
        if not self.first_token_at:
            prefix.failed(name, fingerprint, self._matched_blocks)
        elif self.usage is not None:
            prefix.observed(name, fingerprint, self._matched_blocks, self.usage)

    # -- events

    @property
    def held(self) -> bool:
        """Booked, but to be held back until the replica's waiting prompts leave room (:meth:`wait_turn`)."""
        return self.lead is not None and self.lead.released is not None

    async def wait_turn(self, longest_s: float) -> None:
        """Wait while the replica has enough prompts waiting unscheduled: sent now, this prompt would make their
        batch longer; held, it leads the next. At most ``longest_s``, then it goes anyway."""
        lead = self.lead
        assert lead is not None and lead.released is not None
        prefilling = self._dispatcher.prefilling
        try:
            await asyncio.wait_for(asyncio.shield(lead.released), longest_s)
        except TimeoutError:
            prefilling.send_now(lead)
            self._track_batch()
        # Measured from here, behind what is booked there less this prompt and the prompts held behind it.
        own, peers = self.backend.own, self.backend.peers
        held_tokens, held = prefilling.held(self.backend.name)
        ahead = own.pending_prefill_tokens - held_tokens - self.uncached
        self._mark_sent(ahead + peers.pending_prefill_tokens, own.in_flight - 1 - held)

    def first_token(self) -> float:
        """The first token came back: the prompt's prefill is done (and teaches the replica's prefill rate).
        Returns when (``perf_counter``)."""
        now = self.first_token_at = time.perf_counter()
        if self._prefill_order:
            self._learn_prefill_rate(now)
            self.backend.own.prefilled_tokens += self.uncached
        self._end_prefill()
        return now

    @property
    def wants_text(self) -> bool:
        """Whether the next read of the stream should be checked for generated text (:meth:`saw_text`)."""
        if not self._prefill_order:
            return False
        return not self._streamed_text or self._dispatcher.prefilling.awaits_pass(self.backend.name)

    def saw_text(self) -> None:
        """A read of the stream carried generated text: text from a later pass than the first means the replica
        began another pass, and prefixes whose batch formed before it may now be joined."""
        if not self._streamed_text:
            self._streamed_text = True
        else:
            self._dispatcher.prefilling.progressed(self.backend.name)

    def reported(self, usage: Mapping[str, Any] | None) -> None:
        """The backend reported ``usage`` (its answer may still be on its way to the client): what settling
        teaches the prefix index, even if the client leaves before the last bytes."""
        self.usage = usage

    def done(self, usage: Mapping[str, Any] | None, *, streamed: bool) -> float | None:
        """The backend answered in full with ``usage``: its time from the request's arrival feeds the backend's
        recent service time. A streamed answer also teaches its recent TTFT and TPOT (what hosted predictions
        use); returns its TPOT when it can be measured."""
        self.usage = usage
        self.backend.observe_service_time(time.perf_counter() - self._started)
        if not streamed:
            return None
        tokens = (usage or {}).get("completion_tokens")
        tpot = None
        if isinstance(tokens, int) and tokens > 1 and self.first_token_at:
            tpot = (time.perf_counter() - self.first_token_at) / (tokens - 1)
        ttft = self.first_token_at - self.sent_at if self.first_token_at else None
        self.backend.observe_latency(ttft, tpot)
        return tpot

    # -- inside

    def _mark_sent(self, prefill_ahead: int, in_flight_ahead: int) -> None:
        """The request leaves now, behind ``prefill_ahead`` uncached tokens and ``in_flight_ahead`` requests."""
        max_running = self.backend.max_running
        slots_full = max_running and in_flight_ahead >= max_running
        self.prefill_ahead = None if slots_full else prefill_ahead
        self.sent_to_busy = in_flight_ahead > 0
        self.sent_at = time.perf_counter()

    def _end_prefill(self) -> None:
        self.backend.own.pending_prefill_tokens -= self.uncached
        self.uncached = 0
        if self.lead is not None:
            self._dispatcher.prefilling.ended(self.lead)
            self.lead = None
            self._track_batch()

    def _track_batch(self) -> None:
        """The replica's batch in progress may have changed: its snapshots count it done as it computes."""
        own = self.backend.own
        own.running_prefill_tokens, own.running_prefill_since = self._dispatcher.prefilling.running(self.backend.name)

    def _learn_prefill_rate(self, now: float) -> None:
        """Teach the replica's prefill estimate (:mod:`backends.prefill_rate`) what this first token took.

        In the gateway's own units, at the first token rather than from the usage at the end: predictions count
        pending and uncached tokens as the gateway estimates them, and a rate learned a whole reply sooner follows
        a burst while it lasts."""
        backend, own = self.backend, self.backend.own
        previous = own.last_first_token_at
        own.last_first_token_at = now
        # Other gateway processes' requests prefilled here since the previous first token (gateway.dispatch.peer_load).
        peers_prefilled = backend.peers.prefilled_tokens - own.peers_prefilled_at_first_token
        own.peers_prefilled_at_first_token = backend.peers.prefilled_tokens
        if self.prefill_ahead is None:
            return  # sent while every running slot was taken: its wait included other requests' decoding
        # Waiting since before the previous first token: the replica worked on this one (and whatever the other
        # processes had prefilled meanwhile) from then to now.
        drain_s = now - previous if self._started < previous else None
        backend.prefill.observe(
            self.prefill_ahead,
            self.uncached,
            now - self.sent_at,
            drain_s,
            drained_tokens=self.uncached + peers_prefilled,
            busy=self.sent_to_busy,
        )
