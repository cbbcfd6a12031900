"""The shared prefix index survives a Redis outage: changes wait in the outbox, then reach the peers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import redis.asyncio as aioredis

from spillgate.cache.index import PrefixIndex
from spillgate.cache.shared_index import SharedPrefixIndex
from spillgate.gateway.dispatch.coalesce import PrefillsInFlight
from tests.support.procs import free_port
from tests.support.redis_server import redis_url


def make_index() -> PrefixIndex:
    index = PrefixIndex()
    index.set_capacity("r0", 1000)
    return index


def follower(
    url: str, stream: str, prefills: PrefillsInFlight | None = None, index: PrefixIndex | None = None
) -> SharedPrefixIndex:
    """A process's shared index on ``stream``; its socket timeout is above the stream reads' 1 s block, so that
    it counts as connected once an idle read has answered."""
    shared = SharedPrefixIndex(index or make_index(), aioredis.from_url(url, socket_timeout=3), stream=stream)
    shared.prefills = prefills
    return shared


@contextlib.asynccontextmanager
async def running(*shared: SharedPrefixIndex) -> AsyncIterator[None]:
    """Start them, connected, and stop them whatever happens."""
    for one in shared:
        await one.start()
    try:
        await wait_for(lambda: all(one.connected for one in shared))
        yield
    finally:
        for one in shared:
            await one.stop()


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_changes_made_during_an_outage_arrive_when_redis_returns(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    writer = SharedPrefixIndex(make_index(), aioredis.from_url(url, socket_timeout=1), stream="t:outage")
    reader_index = make_index()
    reader = SharedPrefixIndex(reader_index, aioredis.from_url(url, socket_timeout=1), stream="t:outage")
    await writer.start()
    await reader.start()
    try:
        writer.publish("insert", "r0", [11, 12, 13])
        await asyncio.sleep(0.3)
        assert not writer.connected
        assert reader_index.match([11, 12, 13], ["r0"]) == {"r0": 0}
        with redis_url(tmp_path, port=port):
            await wait_for(lambda: reader_index.match([11, 12, 13], ["r0"]) == {"r0": 3}, timeout=8)
            assert reader.connected
            writer.publish("forget", "r0", [11, 12, 13], 1)
            await wait_for(lambda: reader_index.match([11, 12, 13], ["r0"]) == {"r0": 1})
            writer.publish("clear", "r0")
            await wait_for(lambda: reader_index.blocks_held("r0") == 0)
    finally:
        await writer.stop()
        await reader.stop()


async def test_an_outage_of_any_length_keeps_the_outbox_bounded(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    writer = SharedPrefixIndex(make_index(), aioredis.from_url(url, socket_timeout=1), stream="t:bound", max_entries=50)
    reader_index = make_index()
    reader = SharedPrefixIndex(reader_index, aioredis.from_url(url, socket_timeout=1), stream="t:bound")
    await writer.start()
    await reader.start()
    try:
        for block in range(500):
            writer.publish("insert", "r0", [block])
        await asyncio.sleep(0.3)  # a flush has failed and put its batch back
        assert not writer.connected
        writer.publish("insert", "r0", [1000])
        assert writer.backlog == 50
        with redis_url(tmp_path, port=port):
            await wait_for(lambda: reader_index.match([1000], ["r0"]) == {"r0": 1}, timeout=8)
            assert writer.backlog == 0
            kept = [block for block in range(500) if reader_index.match([block], ["r0"])["r0"]]
            assert kept == list(range(451, 500)), "the newest changes arrive, the oldest were dropped"
    finally:
        await writer.stop()
        await reader.stop()


async def test_a_prefill_announced_by_one_process_is_waited_for_by_the_other(tmp_path: Path) -> None:
    stream = f"t:announce:{uuid.uuid4().hex}"
    with redis_url(tmp_path) as url:
        writer = follower(url, stream)
        reader_prefills = PrefillsInFlight()
        async with running(writer, follower(url, stream, reader_prefills)):
            number = writer.announce("r0", [21, 22])
            assert number is not None
            await wait_for(lambda: reader_prefills.computing("r0", [21, 22], 2)[0] is not None)
            lead, blocks = reader_prefills.computing("r0", [21, 22], 2)
            assert blocks == 2 and lead is not None and not lead.started.done()
            writer.announce_started("r0", number)
            await asyncio.wait_for(lead.started, 5)
            assert reader_prefills.computing("r0", [21, 22], 2) == (None, 0)


async def test_a_process_started_later_does_not_wait_for_announcements_in_the_history(tmp_path: Path) -> None:
    """An announcement never followed by its start (its process died) must not hold a process that joins later."""
    stream = f"t:history:{uuid.uuid4().hex}"
    with redis_url(tmp_path) as url:
        writer = follower(url, stream)
        async with running(writer):
            writer.publish("insert", "r0", [31, 32])
            writer.announce("r0", [31, 32])
            await wait_for(lambda: writer.backlog == 0)
            await asyncio.sleep(0.05)
            late_index = make_index()
            late_prefills = PrefillsInFlight()
            late = follower(url, stream, late_prefills, late_index)
            async with running(late):
                await wait_for(lambda: late.applied >= 2)
                assert late_index.match([31, 32], ["r0"]) == {"r0": 2}, "the history's index entries still apply"
                assert late_prefills.computing("r0", [31, 32], 2) == (None, 0)
                writer.announce("r0", [33])
                await wait_for(lambda: late_prefills.computing("r0", [33], 1)[0] is not None)


async def test_announcements_are_dropped_when_their_process_stops_or_redis_goes(tmp_path: Path) -> None:
    """Nothing could say they started: requests waiting for them would wait their longest."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with redis_url(tmp_path, port=port):
        stopping = follower(url, "t:gone")
        staying = follower(url, "t:gone")
        prefills = PrefillsInFlight()
        listener = follower(url, "t:gone", prefills)
        for shared in (stopping, staying, listener):
            await shared.start()
        try:
            await wait_for(lambda: stopping.connected and staying.connected and listener.connected)
            stopping.announce("r0", [41])
            staying.announce("r0", [42])
            await wait_for(lambda: len(prefills) == 2)
            await stopping.stop()
            await wait_for(lambda: prefills.computing("r0", [41], 1) == (None, 0))
            lead, _ = prefills.computing("r0", [42], 1)
            assert lead is not None and not lead.started.done()
        except BaseException:
            await staying.stop()
            await listener.stop()
            raise
    try:
        await asyncio.wait_for(lead.started, 5)  # Redis went away: the listener cannot hear it start
        assert len(prefills) == 0 and not listener.connected
        assert listener.announce("r0", [43]) is None, "nothing is announced while Redis is away"
    finally:
        await staying.stop()
        await listener.stop()
