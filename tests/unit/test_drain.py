"""Draining: a second stop signal ends the drain now, even when a request it cut cannot end its answer."""

from __future__ import annotations

import asyncio
import contextlib

from spillgate.gateway.serving.drain import Drain
from spillgate.gateway.serving.exchange import Attempt

DRAIN_S = 3600.0
"""A deadline the test would never see: only a hurried drain returns within the test's wait."""


async def test_a_second_signal_ends_the_drain_although_a_cut_request_stays_stuck() -> None:
    drain = Drain()
    client_reads = asyncio.Event()

    async def writing_to_a_client_that_stopped_reading() -> None:
        try:
            await asyncio.sleep(DRAIN_S)
        except asyncio.CancelledError:
            await client_reads.wait()  # as ``end_cut`` sending its error event into a full socket
            raise

    request = asyncio.create_task(writing_to_a_client_that_stopped_reading())
    drain.enter(request, Attempt(request_id="stuck", started=0.0))
    running = asyncio.create_task(drain.run(DRAIN_S))
    await asyncio.sleep(0)
    assert drain.draining and not running.done()

    drain.hurry()
    await asyncio.wait_for(running, 30)  # the cut's grace, not the hour left to the first deadline
    assert drain.was_cut(request) and not request.done(), "the request was cut and is still stuck"

    client_reads.set()
    with contextlib.suppress(asyncio.CancelledError):
        await request


async def test_without_a_second_signal_the_drain_waits_for_its_requests() -> None:
    drain = Drain()
    finish = asyncio.Event()

    async def streaming() -> None:
        await finish.wait()
        drain.leave(asyncio.current_task())  # type: ignore[arg-type]

    request = asyncio.create_task(streaming())
    drain.enter(request, Attempt(request_id="streaming", started=0.0))
    running = asyncio.create_task(drain.run(DRAIN_S))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not running.done(), "a request in flight keeps the drain waiting"
    finish.set()
    await asyncio.wait_for(running, 30)
    assert not drain.was_cut(request) and drain.in_flight == 0
