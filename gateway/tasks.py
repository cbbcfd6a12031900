"""Background loops that keep a connection alive must still end when their task is cancelled."""

from __future__ import annotations

import asyncio


def cancel_requested() -> bool:
    """Whether the running task has been asked to stop.

    redis-py can turn a cancellation that lands in the middle of a command into a connection error. A
    reconnect loop that catches those errors would carry on, and whoever awaits the task (``stop()``) would
    wait forever: such a loop checks this after catching one."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
