"""Sharing the prefix index between gateway processes through a Redis stream.

Every process keeps its own in-process :class:`~cache.index.PrefixIndex` and routes from it, so a
decision never waits on Redis. What a process learns (a request dispatched to a replica, entries
withdrawn, a replica cleared) is appended to one bounded Redis stream by a background task, and every
process applies the others' entries as they arrive: all processes converge on the same view within a
few milliseconds. A process that starts late replays the stream's retained history. If Redis goes away,
each process keeps routing on what it knows and catches up from the stream when Redis returns; what it
learned meanwhile waits in an outbox bounded like the stream (``max_entries``, oldest dropped first: the
stream would have trimmed those anyway), so an outage of any length costs bounded memory.

Besides the index, processes announce the new prefixes they have sent and not yet seen start prefilling
(``computing``, then ``started``), so that another process's request sharing one waits for that prefill
instead of joining its batch and computing the prefix again (:mod:`gateway.dispatch.coalesce`).

Measured cost on the request path: appending to an in-memory list (well under a microsecond) instead of
a Redis round trip (~100-200 us on loopback) per decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from spillgate.cache.index import PrefixIndex

log = logging.getLogger("spillgate.prefix.shared")


def _stop_if_cancelled(cause: BaseException | None = None) -> None:
    """End a reconnecting loop whose task was cancelled: redis-py may turn a cancellation into a connection error
    (or swallow it in a blocking read), and a loop that retries on those would never stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from cause


Operation = Literal["insert", "forget", "clear", "computing", "started", "gone"]
_ANNOUNCEMENTS = frozenset({b"computing", b"started", b"gone"})
"""Entries worth sending only now: after an outage they are stale, and they must not crowd the index's out."""
_Entry = tuple[bytes, bytes, bytes, bytes]
_FLUSH_INTERVAL_S = 0.005
_RETRY_S = 1.0


class RemotePrefills(Protocol):
    """What a process does with the prefills other processes announce
    (:class:`gateway.dispatch.coalesce.PrefillsInFlight`)."""

    def computing_elsewhere(self, origin: bytes, number: int, replica: str, hashes: Sequence[int]) -> None: ...

    def started_elsewhere(self, origin: bytes, number: int) -> None: ...

    def forget_elsewhere(self, origin: bytes | None = None) -> None: ...


class SharedPrefixIndex:
    """Publishes local index changes to Redis and applies other processes' changes locally."""

    def __init__(
        self,
        index: PrefixIndex,
        client: aioredis.Redis,
        *,
        stream: str = "spillgate:prefix-index",
        max_entries: int = 100_000,
    ) -> None:
        self.index = index
        self._redis = client
        self._stream = stream
        self._max_entries = max_entries
        self._origin = f"{os.getpid()}-{os.urandom(4).hex()}".encode()
        self._outbox: deque[_Entry] = deque(maxlen=max_entries)
        self._tasks: list[asyncio.Task[None]] = []
        self.connected = False
        self.applied = 0
        self.prefills: RemotePrefills | None = None
        """Told of the prefills other processes announce; ``None`` ignores them."""
        self.sent_elsewhere: Callable[[str, Sequence[int], int], None] | None = None
        """Told of each request another process sent (live entries only) and the data-parallel rank it went to
        (an insert's ``depth``), for replicas matched on their events."""
        self._announced = 0
        self._replay_end: tuple[int, int] | None = None
        """The newest entry when this process started following: announcements up to it are history."""

    # Called on the request path: cheap, never waits. ---------------------------------------------

    def publish(self, op: Operation, replica: str, hashes: Sequence[int] = (), depth: int = 0) -> None:
        """``depth``: a forget's depth, an announcement's number, or the data-parallel rank an insert went to."""
        self._outbox.append((op.encode(), replica.encode(), array("Q", hashes).tobytes(), str(depth).encode()))

    def announce(self, replica: str, hashes: Sequence[int]) -> int | None:
        """Tell the other processes that a request sent to ``replica`` will compute the blocks ``hashes`` there
        once it starts; the number returned is for :meth:`announce_started`.
        Nothing is announced while Redis is unreachable (``None``): it would be stale by the time it arrived."""
        if not self.connected:
            return None
        self._announced += 1
        self.publish("computing", replica, hashes, self._announced)
        return self._announced

    def announce_started(self, replica: str, number: int) -> None:
        self.publish("started", replica, (), number)

    @property
    def backlog(self) -> int:
        """Changes not yet written to Redis (at most ``max_entries``)."""
        return len(self._outbox)

    # Background work -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._flush_forever(), name="spillgate-prefix-publish"),
            asyncio.create_task(self._follow_forever(), name="spillgate-prefix-follow"),
        ]

    async def stop(self) -> None:
        self.publish("gone", "")  # the others stop waiting for what this process announced
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(RedisError, OSError):
            await self._flush_once()
        await self._redis.aclose()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(_FLUSH_INTERVAL_S)
            try:
                await self._flush_once()
            except (RedisError, OSError) as exc:
                _stop_if_cancelled(exc)
                self._lost(exc)
                await asyncio.sleep(_RETRY_S)

    async def _flush_once(self) -> None:
        if not self._outbox:
            return
        batch = list(self._outbox)
        self._outbox.clear()
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for op, replica, hashes, depth in batch:
                    fields = {b"o": self._origin, b"op": op, b"r": replica, b"h": hashes, b"d": depth}
                    pipe.xadd(self._stream, fields, maxlen=self._max_entries, approximate=True)
                await pipe.execute()
        except BaseException:
            # Try again later, in order; past the bound the oldest go, as the stream would trim them.
            retry = deque((entry for entry in batch if entry[0] not in _ANNOUNCEMENTS), maxlen=self._max_entries)
            retry.extend(self._outbox)
            self._outbox = retry
            raise

    async def _follow_forever(self) -> None:
        last_id = b"0-0"  # replay what the stream retains, then follow it
        while True:
            try:
                if self._replay_end is None:
                    newest = await self._redis.xrevrange(self._stream, count=1)
                    self._replay_end = _entry_order(newest[0][0]) if newest else (0, 0)
                replies = await self._redis.xread({self._stream: last_id}, count=1000, block=1000)
                _stop_if_cancelled()  # redis-py can swallow a cancellation that lands in a blocking read
                if not self.connected:
                    self.connected = True
                    log.info("prefix index shared through Redis stream %s", self._stream)
                for _, entries in replies or ():
                    for entry_id, fields in entries:
                        last_id = entry_id
                        try:
                            self._apply(fields, live=_entry_order(entry_id) > self._replay_end)
                        except (KeyError, ValueError) as exc:  # malformed (another version?): skip it, keep following
                            log.warning("prefix index: skipped stream entry %s (%r)", entry_id, exc)
            except (RedisError, OSError) as exc:
                _stop_if_cancelled(exc)
                self._lost(exc)
                # Announcements cannot be heard start now, and those written meanwhile are stale on return.
                self._replay_end = None
                if self.prefills is not None:
                    self.prefills.forget_elsewhere()
                await asyncio.sleep(_RETRY_S)

    def _apply(self, fields: dict[bytes, bytes], *, live: bool = True) -> None:
        """Apply another process's entry; an announced prefill only when ``live`` (not replayed history: it
        started long ago, or its process died before saying so)."""
        if fields.get(b"o") == self._origin:
            return
        replica = fields[b"r"].decode()
        hashes = array("Q")
        hashes.frombytes(fields[b"h"])
        op = fields[b"op"]
        if op == b"insert":
            self.index.insert_if_known(replica, hashes)
            if live and self.sent_elsewhere is not None:
                self.sent_elsewhere(replica, hashes, int(fields.get(b"d", b"0")))
        elif op == b"forget":
            self.index.forget_after(replica, hashes, int(fields[b"d"]))
        elif op == b"clear":
            self.index.clear(replica)
        elif self.prefills is not None and live and op == b"computing":
            self.prefills.computing_elsewhere(fields[b"o"], int(fields[b"d"]), replica, hashes)
        elif self.prefills is not None and op == b"started":
            self.prefills.started_elsewhere(fields[b"o"], int(fields[b"d"]))
        elif self.prefills is not None and op == b"gone":
            self.prefills.forget_elsewhere(fields[b"o"])
        self.applied += 1

    def _lost(self, exc: BaseException) -> None:
        if self.connected:
            log.warning("Redis unreachable (%s); routing on the local prefix index until it returns", exc)
        self.connected = False


def _entry_order(entry_id: bytes) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as a comparable pair."""
    millis, _, sequence = entry_id.partition(b"-")
    return int(millis), int(sequence or 0)
