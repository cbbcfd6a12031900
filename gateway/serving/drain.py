"""Draining on shutdown: refuse new completions, let those in flight finish, cut what is left at the deadline.

A gateway told to stop (SIGTERM) keeps its socket open, so that requests still routed to it (a load balancer
learns of the stop from ``/ready`` a few seconds late) get a clear 503 with ``retry-after`` rather than a refused
connection, and it lets every completion in flight finish within ``timeouts.drain_s``. A stream still open at the
deadline is ended by the gateway itself with an error event (OpenAI's ``{"error": {...}}`` as one ``data:`` line)
and a properly closed body, so the client can tell a shutdown from a broken connection; a request whose answer has
not started gets the same 503 as a new one. Both are booked as any request cut off is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from spillgate.gateway.errors import ApiError, error_body
from spillgate.gateway.serving.exchange import JSON_HEADERS, Attempt, Send, send_json

log = logging.getLogger("spillgate.gateway")

RETRY_AFTER_S = 1
"""What a refused client is told to wait: another process, or this one's replacement, takes the retry."""
SHUTTING_DOWN = "The gateway is shutting down; retry the request."
_REFUSAL = error_body(503, SHUTTING_DOWN, code="shutting_down")
_REFUSAL_HEADERS = ((b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close"))
_CUT_EVENT = ApiError(
    503, "The gateway shut down before the answer was complete (timeouts.drain_s passed).", code="shutting_down"
)
_CUT_GRACE_S = 2.0
"""How long requests cut at the deadline get to write their error and close their books."""


class Drain:
    """The completions in flight, by task, and whether the process is draining. One per process."""

    __slots__ = ("_cut", "_hurried", "_idle", "_requests", "deadline", "draining")

    def __init__(self) -> None:
        self.draining = False
        self.deadline = 0.0
        """``time.monotonic()`` at which what is still in flight is cut; 0 until draining."""
        self._requests: dict[asyncio.Task[object], Attempt] = {}
        self._cut: set[asyncio.Task[object]] = set()
        self._idle = asyncio.Event()
        self._hurried = asyncio.Event()
        """Set by :meth:`hurry`: :meth:`run` stops waiting for the deadline."""

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def enter(self, task: asyncio.Task[object], attempt: Attempt) -> None:
        self._requests[task] = attempt

    def leave(self, task: asyncio.Task[object]) -> None:
        self._requests.pop(task, None)
        self._cut.discard(task)
        if self.draining and not self._requests:
            self._idle.set()

    def was_cut(self, task: asyncio.Task[object]) -> bool:
        """Whether the drain cancelled ``task`` (not the client leaving, nor anything else)."""
        return task in self._cut

    async def run(self, drain_s: float) -> None:
        """Drain: from now on completions are refused; returns once none is in flight, cutting those still
        running after ``drain_s`` seconds (each then gets a moment to end its answer and its books)."""
        if not self.draining:
            self.draining = True
            self.deadline = time.monotonic() + drain_s
            if not self._requests:
                self._idle.set()
            log.warning("draining: %d completion(s) in flight get %g s to finish", len(self._requests), drain_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle_or_hurried(), max(0.0, self.deadline - time.monotonic()))
        if self._requests:
            log.warning("drain deadline: cutting %d completion(s) still in flight", len(self._requests))
            self.cut_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), _CUT_GRACE_S)

    def hurry(self) -> None:
        """A second stop signal: the deadline is now. :meth:`run` is woken too: a request cut while stuck writing
        to a client that stopped reading never leaves, and must not hold the process until the old deadline."""
        self.deadline = time.monotonic()
        self.cut_all()
        self._hurried.set()

    async def _idle_or_hurried(self) -> None:
        waits = {asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(self._hurried.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def cut_all(self) -> None:
        for task, attempt in list(self._requests.items()):
            if task in self._cut or task.done():
                continue
            self._cut.add(task)
            if attempt.outcome != "ok":
                attempt.outcome = "shutting_down"  # kept by the books: forwarding sets it only on a normal end
            task.cancel()


async def refuse(send: Send, attempt: Attempt) -> None:
    """Answer a completion that arrives while draining (its body unread: the connection closes after)."""
    attempt.status, attempt.error_code, attempt.refused = 503, "shutting_down", True
    await send_json(send, 503, [*JSON_HEADERS, *_REFUSAL_HEADERS], _REFUSAL)


async def end_cut(send: Send, attempt: Attempt) -> None:
    """End the answer of a request cut at the deadline: an error event on a stream already started, else the
    refusal. An answer already complete is left as it is."""
    attempt.error_code = "shutting_down"
    with contextlib.suppress(RuntimeError, OSError):  # the response had already ended, or the client is gone
        if attempt.status == 0:
            await refuse(send, attempt)
        elif attempt.stream and attempt.status == 200:
            body = b"data: " + _CUT_EVENT.body() + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": False})
