"""Runs the ledger's commits on a thread that only gets the CPU the event loop leaves over.

Why (measured on one pinned core, 1,500 requests/s): the ledger's batch commit (SQLite's b-tree work, the
WAL write, the fsync: 2-5 ms of CPU per 100 ms batch) competed with the event loop for the relay's core,
and the scheduler let it run for a slice while requests waited. Neither the GIL nor the batch's size was
the cause: the same commit in a GIL-free child process delayed the loop as much, and a faster switch
interval barely helped. At Linux's ``SCHED_IDLE`` the loop takes the core back as soon as it has work, and
the loop's lateness matched a gateway that does not write at all.

An idle-priority thread starves while the loop keeps its core 100% busy, and an unprivileged thread may
not raise its priority back; so a batch that took longer than :data:`STARVED_S` sends the next batches to a
normal-priority thread for :data:`NORMAL_FOR_S`, which bounds how far the file can fall behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

log = logging.getLogger("spillgate.accounting")

T = TypeVar("T")

STARVED_S = 0.5
NORMAL_FOR_S = 10.0


def lower_to_idle() -> bool:
    """Put the calling thread at ``SCHED_IDLE`` (Linux); False where that is not available."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        log.debug("ledger writer stays at normal priority: %s", exc)
        return False
    return True


class IdleWorker:
    """Two one-thread executors, idle and normal priority; :meth:`run` picks one per call."""

    def __init__(self, name: str) -> None:
        self._idle = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-idle", initializer=lower_to_idle)
        self._normal = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-normal")
        self._normal_until = 0.0

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on the idle thread, or on the normal one while the idle one is being starved."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        if started < self._normal_until:
            return await loop.run_in_executor(self._normal, work, *args)
        result = await loop.run_in_executor(self._idle, work, *args)
        took = time.monotonic() - started
        if took > STARVED_S:
            log.info("ledger commit took %.2f s at idle priority: normal priority for %g s", took, NORMAL_FOR_S)
            self._normal_until = time.monotonic() + NORMAL_FOR_S
        return result

    def shutdown(self) -> None:
        """Wait for any commit still running (one cancelled by its caller, say) and end both threads."""
        self._idle.shutdown(wait=True)
        self._normal.shutdown(wait=True)
