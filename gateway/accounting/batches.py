"""Group commit: items handed over one at a time, sent together, each caller told whether its item was sent.

Booking a finished request in Redis cost one script call per request. Bookings now wait here up to
``interval_s`` (or until ``max_batch`` wait) and go in one call to ``send``, so Redis and the client pay per
batch, not per request. What waits is in memory only: each caller still holds its item and learns its batch's
fate (``True``: sent; ``False``: not, so it keeps the item for a later try). A task runs only while something
waits, so there is nothing to start or stop: whoever awaits :meth:`Batches.send` keeps the batch going, and
a stop that waits for its callers waits for their batches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger("spillgate.accounting")

T = TypeVar("T")


class Batches(Generic[T]):
    def __init__(
        self, send: Callable[[Sequence[T]], Awaitable[bool]], *, interval_s: float = 0.02, max_batch: int = 500
    ) -> None:
        self._send = send
        self.interval_s = interval_s
        self.max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[bool]]] = []
        self._now = asyncio.Event()
        """Send without waiting out the interval: a batch is full, or a reader wants everything sent."""
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def send(self, item: T) -> bool:
        """Hand ``item`` over; True once the batch it went in was sent, False when it could not be."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._waiting.append((item, future))
        if len(self._waiting) >= self.max_batch:
            self._now.set()
        if self._task is None:
            self._task = loop.create_task(self._run(), name="spillgate-batches")
        return await future

    def stop_waiting(self) -> None:
        """From now on send what comes at once (the process is stopping: no batch is worth waiting for)."""
        self.interval_s = 0.0
        self._now.set()

    async def flush(self) -> None:
        """Send what waits now, and return once it is sent (or known not to be)."""
        if not self._waiting:
            return
        pending = [future for _, future in self._waiting]
        self._now.set()
        await asyncio.wait(pending)

    async def _run(self) -> None:
        batch: list[tuple[T, asyncio.Future[bool]]] = []
        try:
            while self._waiting:
                if len(self._waiting) < self.max_batch and not self._now.is_set():
                    try:
                        async with asyncio.timeout(self.interval_s):
                            await self._now.wait()
                    except TimeoutError:
                        pass
                self._now.clear()
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
                if self._waiting and len(self._waiting) >= self.max_batch:
                    self._now.set()
                try:
                    sent = await self._send([item for item, _ in batch])
                except Exception:  # unexpected: each caller keeps its item, as after an outage
                    log.exception("sending a batch of %d failed", len(batch))
                    sent = False
                _resolve(batch, sent)
                batch = []
        finally:
            # Cancelled (the loop is closing): neither what was being sent nor what waits is known to be sent.
            _resolve(batch + self._waiting, False)
            self._waiting = []
            self._now.clear()
            self._task = None


def _resolve(batch: Sequence[tuple[object, asyncio.Future[bool]]], sent: bool) -> None:
    for _, future in batch:
        if not future.done():
            future.set_result(sent)
