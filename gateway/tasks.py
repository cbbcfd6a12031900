"""Background loops that keep a connection alive must still end when their task is cancelled."""

from __future__ import annotations

import asyncio


def stop_if_cancelled(cause: BaseException | None = None) -> None:
    """Raise :class:`asyncio.CancelledError` if the running task has been asked to stop.

    redis-py can turn a cancellation that lands in the middle of a command into a connection error. A
    reconnect loop that catches those errors would carry on, and whoever awaits the task (``stop()``) would
    wait forever: such a loop calls this after catching one."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from cause
