"""One ZMQ subscription to a replica's KV-cache events, kept in sequence.

The engine publishes numbered batches on a PUB socket (:mod:`cache.kv_events`). This subscriber hands each
batch, in order, to a :class:`KvEventSink`, and keeps the sink's record whole:

- a gap in the numbers (the publisher's high-water mark dropped some, or the connection broke) is filled from
  the engine's replay socket when it has one; otherwise the record is cleared and rebuilt from what follows;
- numbers starting again from below the last one mean a new engine process: its cache is empty;
- the first batch of a subscription that cannot be replayed from the start leaves the record *partial*: blocks
  stored before the gateway listened are unknown until they are stored again;
- while a replay runs, and until the live batches queued meanwhile are applied, the record goes through what the
  replica held in the past (a replica that has served for a while keeps thousands of batches, and replaying
  them takes seconds): the sink is told it is *catching up*, and routes without it until it has caught up.

A data-parallel replica publishes each rank's cache on its own sockets, numbered on their own: one subscription
per rank, each its own record in the sink.

Nothing here waits on the request path: the sink applies events in this task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio

from spillgate.cache.kv_events import AllCleared, EventBatch, MalformedBatch, decode_batch, read_seq

log = logging.getLogger("spillgate.kv_events")

_REPLAY_TIMEOUT_S = 2.0
_RECONNECT_S = 1.0
_REPLAY_ROUNDS = 20
_CLEARED = b"AllBlocksCleared"
"""The event's type name, as both engines' encodings (a map's ``type``, a tagged array's tag) spell it."""


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """Where a replica publishes its KV-cache events, as the gateway reaches them."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


class KvEventSink(Protocol):
    """What a subscription tells the record it feeds."""

    def apply(self, replica: str, batch: EventBatch) -> None: ...

    def reset(self, replica: str, *, complete: bool) -> None:
        """Drop the replica's record: it restarted (``complete``: nothing is missing) or events were lost."""
        ...

    def catching_up(self, replica: str, behind: bool) -> None:
        """``behind``: the record is being brought up to date (a replay, or batches queued behind one) and shows
        a past state of the replica's cache; False once it shows the present again."""
        ...


class KvSubscriber:
    """Follows one replica's events (one rank's, of a data-parallel replica) until :meth:`stop`; its counters are
    for ``/health``. ``replica`` is the name the sink knows the record by."""

    def __init__(
        self,
        replica: str,
        source: KvEventSource,
        sink: KvEventSink,
        context: zmq.asyncio.Context,
        *,
        rank: int | None = None,
    ) -> None:
        self.replica = replica
        self.source = source
        self.rank = rank
        """The data-parallel rank followed, when the replica has several: its batches should carry it."""
        self.stamped_rank: int | None = None
        """The rank the last batch carried, where it was not :attr:`rank` (the ports do not follow the ranks)."""
        self._sink = sink
        self._context = context
        self._task: asyncio.Task[None] | None = None
        self.last_seq: int | None = None
        self.batches = 0
        self.gaps = 0
        self.last_gap_at: float | None = None
        self.lag_s: float | None = None
        """Seconds between the engine stamping the last batch and this process applying it."""
        self.complete = False
        """Every block the replica stored since its cache was last empty has been seen."""
        self.errors = 0
        self.caught_up = False
        """Every batch the engine published so far has been applied: no replay runs and none waits in the socket."""
        self._replayed_through = -1
        """The last batch applied from the replay socket: the SUB socket may deliver it again afterwards."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name=f"spillgate-kv-events-{self.replica}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def status(self) -> dict[str, object]:
        shown: dict[str, object] = {} if self.rank is None else {"rank": self.rank}
        if self.stamped_rank is not None:
            shown["stamped_rank"] = self.stamped_rank
        return {
            **shown,
            "endpoint": self.source.endpoint,
            "replay": self.source.replay_endpoint,
            "last_seq": self.last_seq,
            "batches": self.batches,
            "complete": self.complete,
            "caught_up": self.caught_up,
            "lag_s": None if self.lag_s is None else round(self.lag_s, 4),
            "gaps": self.gaps,
            "last_gap_age_s": None if self.last_gap_at is None else round(time.monotonic() - self.last_gap_at, 1),
        }

    async def _follow(self) -> None:
        topic = self.source.topic.encode()
        while True:
            socket = self._context.socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, 100_000)
            socket.setsockopt(zmq.SUBSCRIBE, topic)
            try:
                socket.connect(self.source.endpoint)
                if self.last_seq is None:
                    await self._replay(0, None)  # everything the engine still keeps, from its first batch
                    self._check_caught_up(socket)
                while True:
                    frames = await socket.recv_multipart()
                    await self._received(frames)
                    self._check_caught_up(socket)
            except zmq.ZMQError as exc:
                self.errors += 1
                log.warning("KV events of %s at %s: %s; reconnecting", self.replica, self.source.endpoint, exc)
                await asyncio.sleep(_RECONNECT_S)
            finally:
                socket.close(linger=0)

    async def _received(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.errors += 1
            return
        try:
            seq = read_seq(frames[1])
        except MalformedBatch:
            self.errors += 1
            return
        last = self.last_seq
        if last is not None and seq <= self._replayed_through:
            return  # already applied from the replay socket
        self._replayed_through = -1
        if last is None:
            # The first batch heard: replay what came before it, from the start of the engine's numbering.
            if seq > 0 and not await self._replay(0, seq):
                self._lost()
        elif seq <= last:
            log.warning("replica %s restarted (KV event numbers went from %d to %d)", self.replica, last, seq)
            if seq > 0 and not await self._replay(0, seq):
                self._lost()
        elif seq > last + 1:
            self.gaps += 1
            self.last_gap_at = time.monotonic()
            if not await self._replay(last + 1, seq):
                log.warning("KV events of %s: batches %d-%d lost, not replayable", self.replica, last + 1, seq - 1)
                self._lost()
        self._apply(seq, frames[2])

    def _check_caught_up(self, socket: zmq.asyncio.Socket) -> None:
        """Caught up once nothing waits in the socket after a replay: the live batches that arrived meanwhile are
        applied too."""
        if not self.caught_up and not socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.caught_up = True
            self._sink.catching_up(self.replica, False)

    def _behind(self) -> None:
        if self.caught_up:
            self.caught_up = False
            self._sink.catching_up(self.replica, True)

    def _lost(self) -> None:
        """Events are missing: start the record again from what follows; blocks stored before are unknown."""
        self._sink.reset(self.replica, complete=False)
        self.complete = False

    def _apply(self, seq: int, payload: bytes, *, live: bool = True) -> None:
        if seq == 0:  # the engine's first batch: its cache was empty just before
            self._sink.reset(self.replica, complete=True)
            self.complete = True
        try:
            batch = decode_batch(seq, payload)
        except MalformedBatch as exc:
            self.errors += 1
            log.warning("KV events of %s: batch %d unreadable (%s); rebuilding", self.replica, seq, exc)
            self._lost()
        else:
            if self.rank is not None and batch.rank != self.rank and self.stamped_rank != batch.rank:
                log.warning(
                    "KV events at %s carry rank %d, not %d: the ranks do not publish on the port + rank the gateway "
                    "follows them at",
                    self.source.endpoint,
                    batch.rank,
                    self.rank,
                )
                self.stamped_rank = batch.rank
            self._sink.apply(self.replica, batch)
            self.batches += 1
            if batch.ts and live:  # a replayed batch is as old as the gap it fills
                self.lag_s = max(0.0, time.time() - batch.ts)
        self.last_seq = seq

    async def _replay(self, start: int, until: int | None) -> bool:
        """Ask the replay socket for batches ``start`` to ``until - 1`` (or all it keeps) and apply them; False if
        it cannot, or does not keep ``start`` any more.

        An engine answers a replay with a ROUTER socket, which drops what a reader leaves queued past its
        high-water mark: a long replay arrives cut short (a number skipped, or no end mark). Each round asks again
        from the first batch still missing, as long as the last round brought some."""
        endpoint = self.source.replay_endpoint
        if endpoint is None:
            return False
        self._behind()
        expected = start
        for _ in range(_REPLAY_ROUNDS):
            reached, outcome = await self._replay_round(endpoint, expected, until)
            if outcome == "ended" or (until is not None and reached >= until):
                return reached > start if until is None else reached >= until
            if outcome == "gone" or reached == expected:
                return False
            expected = reached
        log.warning("KV events of %s: replay from %s gave up after %d rounds", self.replica, endpoint, _REPLAY_ROUNDS)
        return False

    async def _replay_round(self, endpoint: str, start: int, until: int | None) -> tuple[int, str]:
        """One request to the replay socket, applying batches from ``start`` on in order: the first number not
        applied, and ``ended`` (the end mark came), ``gone`` (the engine no longer keeps ``start``) or ``cut``."""
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, 0)  # queue all the engine sends: its ROUTER drops what waits past its mark
        received: list[tuple[int, bytes]] = []
        try:
            outcome = await self._receive_replay(socket, endpoint, start, until, received)
        finally:
            socket.close(linger=0)
        await self._apply_replayed(received)
        return start + len(received), outcome

    async def _receive_replay(
        self, socket: zmq.asyncio.Socket, endpoint: str, start: int, until: int | None, into: list[tuple[int, bytes]]
    ) -> str:
        """Read the batches of one replay from ``start`` on, in order, into ``into``; returns how it ended."""
        try:
            socket.connect(endpoint)
            await socket.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(socket.recv_multipart(), _REPLAY_TIMEOUT_S)
                # [b"", seq, payload] (older engines) or [b"", topic, seq, payload]; seq -1 ends it.
                body = frames[1:]
                if len(body) == 3:
                    body = body[1:]
                if len(body) != 2:
                    return "gone"
                seq = read_seq(body[0])
                if seq < 0:
                    return "ended"
                if until is not None and seq >= until:
                    continue
                if seq != start + len(into):
                    # Dropped batches come last, never first: a first number past ``start`` is a buffer moved on.
                    return "cut" if into else "gone"
                into.append((seq, body[1]))
        except TimeoutError:
            if not into:
                log.warning("KV events of %s: replay from %s did not answer", self.replica, endpoint)
            return "cut"
        except (zmq.ZMQError, MalformedBatch) as exc:
            log.warning("KV events of %s: replay from %s failed (%s)", self.replica, endpoint, exc)
            return "gone"

    async def _apply_replayed(self, batches: list[tuple[int, bytes]]) -> None:
        """Apply replayed batches, skipping those before the last that clears the cache (SGLang's ``flush_cache``,
        vLLM's ``reset_prefix_cache``): nothing before it is held any more. A replica that has served a while keeps
        thousands of batches, at page size 1 a few milliseconds each to apply; the engine's first batch is still
        applied, since it shows the record complete. A replay cut short arrives in rounds, each skipping on its own.
        Requests are served between two batches."""
        skip_to = _last_clear(batches)
        for index, (seq, payload) in enumerate(batches):
            if index < skip_to and seq != 0:
                self.last_seq = seq
                continue
            self._apply(seq, payload, live=False)
            await asyncio.sleep(0)
        if batches:
            self._replayed_through = batches[-1][0]


def _last_clear(batches: list[tuple[int, bytes]]) -> int:
    """The index of the last batch that clears the cache, or 0."""
    for index in range(len(batches) - 1, 0, -1):
        seq, payload = batches[index]
        if _CLEARED not in payload:  # a byte search spares decoding every batch
            continue
        try:
            if any(isinstance(event, AllCleared) for event in decode_batch(seq, payload).events):
                return index
        except MalformedBatch:
            continue
    return 0
